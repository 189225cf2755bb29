/* The TensorFlow TPU walk-through's "Putting It All Together", in C, on the
 * emulated pod: resolve the TPU, connect, initialize the TPU system, make the
 * strategy, use a global batch of 128 x num_replicas_in_sync with the
 * mixed_bfloat16 policy, batch and prefetch the dataset, build
 * Dense(128, relu) -> Dense(10, softmax) with Adam and sparse categorical
 * cross-entropy, and fit for 10 epochs with TensorBoard's callback: the
 * profiler on batches 10-20 (LOGDIR/train/plugins/profile/RUN/) and the
 * epoch scalars (LOGDIR/train/events.out.tfevents.*).
 *
 *   fashion_mnist [--tpu ADDR] [--epochs N] [--data DIR] [--logdir DIR]
 *                 [--learning-rate LR] [--lr-schedule cosine|exponential|constant]
 *                 [--warmup-epochs N] [--decay-rate R] [--deterministic] [--seed N]
 *                 [--checkpoint FILE [--checkpoint-every N]] [--recover N [--recover-wait S]]
 *                 [--elastic N [--elastic-wait S] [--elastic-batch global|per-replica]]
 *                 [--history FILE] [--model mlp|cnn] [--input memory|hosts|client]
 *
 * --input chooses where the training input pipeline runs. memory (default):
 * the client reads the files into memory and its one pipeline shuffles and
 * batches the global batch, whose rows it sends to the cores each step.
 * hosts: each core's host (its tpu-worker) reads the IDX files itself and
 * runs its own pipeline (scale to [0, 1], cache, shuffle, batch 128,
 * prefetch) over its shard of the rows, as TensorFlow's
 * distribute_datasets_from_function does on a pod: no training rows pass
 * through the client, which only drives the steps. client: the same
 * per-replica pipelines, run by the client, which sends the rows (bit for bit
 * the batches of hosts). The files must be readable under --data on every
 * host for hosts.
 *
 * --model cnn trains a convolutional network instead of the MLP, as the
 * Keras-on-TPU Fashion-MNIST notebooks do, with a BatchNormalization before
 * each convolution as theirs: BatchNormalization -> Conv2D(32, 3x3, same,
 * relu) -> MaxPooling2D(2) -> BatchNormalization -> Conv2D(64, 3x3, same,
 * relu) -> MaxPooling2D(2) -> Dropout(0.25) -> Flatten -> Dense(128, relu) ->
 * Dropout(0.5) -> Dense(10, softmax), on the images as (28, 28, 1).
 *
 * --history FILE writes each epoch's loss and accuracy, exactly (C99 hex
 * floats), one line per epoch: what a port of this program to another
 * language compares its own history with, bit for bit.
 *
 * With --checkpoint it saves the model after every epoch (or every N steps);
 * with --recover it survives a core that dies: on UNAVAILABLE it waits for
 * the cluster to be whole again, re-initializes the TPU system, compiles the
 * model onto the new system, loads the last checkpoint and goes on, as the
 * "Checkpoints" in docs/guide/training.md describes. With --checkpoint it also acts on a
 * preemption or maintenance notice as TensorFlow's PreemptionCheckpointHandler
 * does: every replica stops at the same step, the checkpoint is saved, and
 * the program exits with status 42 (EXIT_PREEMPTED, TensorFlow's restartable
 * exit code); started again with the same flags, it loads that checkpoint
 * and goes on from that step.
 *
 * With --elastic it trains elastically instead (tpu_fit_options.elastic):
 * fit itself goes on when cores are lost, with all of them if they come back
 * within --elastic-wait seconds, else with the survivors, from the newest
 * state (the checkpoint or fit's snapshot in memory); a notice does not stop
 * it. It prints the history's events at the end.
 *
 * The learning rate follows Keras' CosineDecay with a linear warm-up (TF
 * 2.13+: CosineDecay(0, decay_steps, warmup_target=LR, warmup_steps)): from 0
 * to LR over the first epoch, then down to 0 along a half cosine by the
 * last step. LR is Keras' defaults (Adam's 0.001 at fit's batch of 32) scaled
 * linearly with the global batch: 0.032 at 1024. That is the large-batch
 * rule the warm-up makes safe (Goyal et al. 2017, "Accurate, Large Minibatch
 * SGD": scale the learning rate with the batch, warm it up).
 * --lr-schedule exponential uses ExponentialDecay(LR, steps per epoch,
 * --decay-rate) instead; constant, Adam(LR) with the square-root rule.
 * --deterministic compiles the model in deterministic mode: the same bits on
 * any host CPU.
 *
 * It uses only the public API (tpuemu/model.h, tpuemu/data.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>
#include <tpuemu/tpuemu.h>

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"
#define EXIT_PREEMPTED 42 /* TensorFlow's failure_handling: _RESTARTABLE_EXIT_CODE */

static int fail(const char *what)
{
    fprintf(stderr, "fashion_mnist: %s: %s: %s\n", what, tpu_status_name(tpu_last_status()), tpu_last_error());
    return 1;
}

static int usage(const char *why)
{
    if (why)
        fprintf(stderr, "fashion_mnist: %s\n", why);
    fprintf(stderr, "usage: fashion_mnist [--tpu ADDR] [--epochs N] [--data DIR] [--logdir DIR]\n"
                    "                     [--learning-rate LR] [--lr-schedule cosine|exponential|constant]\n"
                    "                     [--warmup-epochs N] [--decay-rate R] [--deterministic] [--seed N]\n"
                    "                     [--checkpoint FILE [--checkpoint-every N]] [--recover N [--recover-wait S]]\n"
                    "                     [--elastic N [--elastic-wait S] [--elastic-batch global|per-replica]]\n"
                    "                     [--history FILE] [--model mlp|cnn] [--input memory|hosts|client]\n"
                    "  --model M     mlp (default): Dense(128, relu) -> Dense(10, softmax);\n"
                    "                cnn: BatchNormalization -> Conv2D(32, 3, relu) -> MaxPooling2D ->\n"
                    "                BatchNormalization -> Conv2D(64, 3, relu) -> MaxPooling2D ->\n"
                    "                Dropout(0.25) -> Flatten -> Dense(128, relu) -> Dropout(0.5) ->\n"
                    "                Dense(10, softmax) on the 28x28x1 images\n"
                    "  --tpu TPU     the TPU: HOST:PORT, grpc://HOST:PORT or a TPU name\n"
                    "                (default $TPU_NAME, else 127.0.0.1:8470)\n"
                    "  --epochs N    epochs to train (default 10)\n"
                    "  --data DIR    the Fashion-MNIST IDX files (default " DEFAULT_DATA ",\n"
                    "                Debian package dataset-fashion-mnist)\n"
                    "  --logdir DIR  TensorBoard's log directory: the profile of batches 10-20 and the\n"
                    "                epoch scalars go under DIR/train (default logs)\n"
                    "  --learning-rate LR  Adam's peak learning rate (default 0.001 x global batch / 32;\n"
                    "                with --lr-schedule constant 0.001 x sqrt(global batch / 128))\n"
                    "  --lr-schedule S  cosine (default): linear warm-up from 0 to LR, then cosine decay\n"
                    "                to 0 at the last step (Keras' CosineDecay with warmup_target);\n"
                    "                exponential: LR x R^(step / steps per epoch) (ExponentialDecay);\n"
                    "                constant: LR throughout\n"
                    "  --warmup-epochs N  epochs of warm-up for cosine (default 1; 0: none)\n"
                    "  --seed N      the initial weights' seed (default 42)\n"
                    "  --decay-rate R  exponential's decay per epoch (default 0.7)\n"
                    "  --deterministic  the same bits on any host CPU (portable matrix unit; slower)\n"
                    "  --checkpoint FILE   save the model there after every epoch\n"
                    "  --checkpoint-every N  ... every N steps instead (1..1000000)\n"
                    "  --recover N   when a core fails (UNAVAILABLE), up to N times (1..100): wait for\n"
                    "                the cluster to be whole, re-initialize, load FILE and go on\n"
                    "  --recover-wait S  the longest to wait for the cluster each time (default 120 s)\n"
                    "  --elastic N   elastic training: go on through up to N lost cores (1..1000), with\n"
                    "                the survivors when they are not back in time\n"
                    "  --elastic-wait S  how long to wait for lost cores to come back (default 30 s)\n"
                    "  --elastic-batch global|per-replica  keep the global batch (default) or each\n"
                    "                replica's batch when the replicas change\n"
                    "  --history FILE  write each epoch's loss and accuracy there, exactly (hex floats)\n"
                    "  --input P     where the training input pipeline runs: memory (default: the client\n"
                    "                reads the files and sends each core its rows), hosts (each core's\n"
                    "                host reads the files under --data and makes its own batches: no rows\n"
                    "                through the client) or client (the hosts' pipelines, run by the client)\n");
    return 2;
}

/* images -> floats in [0, 1], labels -> int32 class ids */
static int load(const char *dir, const char *prefix, float **x, int32_t **y, size_t *n)
{
    char path[4096];
    tpu_idx img, lab;
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    if (tpu_idx_read(path, &img) != TPU_OK)
        return fail("reading the images");
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
    if (tpu_idx_read(path, &lab) != TPU_OK) {
        tpu_idx_free(&img);
        return fail("reading the labels");
    }
    if (img.rank != 3 || img.dims[1] * img.dims[2] != 784 || lab.rank != 1 || lab.dims[0] != img.dims[0]) {
        fprintf(stderr, "fashion_mnist: %s: expected N x 28 x 28 images and N labels\n", prefix);
        tpu_idx_free(&img);
        tpu_idx_free(&lab);
        return 1;
    }
    *n = img.dims[0];
    int rc = tpu_idx_to_float(&img, 1.0f / 255.0f, x) != TPU_OK || tpu_idx_to_labels(&lab, y) != TPU_OK;
    tpu_idx_free(&img);
    tpu_idx_free(&lab);
    return rc ? fail("converting the data") : 0;
}

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Cores that are alive with a heartbeat younger than two intervals, and in
 * others the names of the rest. A core that has just died is still READY
 * until it misses --dead-after heartbeats, but its heartbeat ages at once.
 * -1 when the resolver does not answer. *hb_ms gets the interval. */
static int fresh_cores(tpu_cluster *c, char *others, size_t n, long *hb_ms)
{
    tpu_cluster_spec *s;
    size_t used = 0;
    int live = 0;
    others[0] = 0;
    if (tpu_cluster_spec_get(c, &s) != TPU_OK) {
        snprintf(others, n, "%s: %s", tpu_status_name(tpu_last_status()), tpu_last_error());
        return -1;
    }
    *hb_ms = (long)tpu_cluster_spec_heartbeat_ms(s);
    for (size_t i = 0; i < tpu_cluster_spec_num_cores(s); i++) {
        tpu_core_info ci;
        if (tpu_cluster_spec_core(s, i, &ci) != TPU_OK)
            continue;
        if ((ci.state == TPU_CORE_IDLE || ci.state == TPU_CORE_READY) && ci.heartbeat_age_ms <= 2 * (uint64_t)*hb_ms)
            live++;
        else if (used < n) {
            int k = snprintf(others + used, n - used, "%s%s/%d (%s, last heartbeat %.1f s ago)", used ? ", " : "",
                             ci.host_id, ci.core, tpu_core_state_name(ci.state), (double)ci.heartbeat_age_ms / 1000.0);
            used = k < 0 ? n : used + (size_t)k;
        }
    }
    tpu_cluster_spec_free(s);
    return live;
}

static tpu_status failed(const char *what)
{
    fail(what);
    return tpu_last_status();
}

/* After a core failed: waits (at most wait_s) until the cluster has want
 * live cores again, re-initializes the TPU system (a new epoch: every core
 * reset), compiles the model onto it and loads the checkpoint when there is
 * one (*resume = 1; 0: none yet, training starts again). TPU_OK, or the
 * status of what failed, having said why (TPU_UNAVAILABLE: another core
 * failed meanwhile). */
static tpu_status recover(tpu_cluster *c, tpu_topology **topology, tpu_model *m, const tpu_compile_options *co,
                   const char *ckpt, int want, int wait_s, int *resume)
{
    long t0 = now_ms(), deadline = t0 + (long)wait_s * 1000, hb_ms = 1000, said = -1;
    char others[1024];
    tpu_topology *t = NULL;

    for (;;) {
        long now = now_ms();
        int live = fresh_cores(c, others, sizeof others, &hb_ms);
        /* wait two heartbeats, so that the failed core's last one is stale */
        if (live >= want && now - t0 >= 2 * hb_ms) {
            tpu_init_options io = {.expect = (uint32_t)want,
                                   .timeout_ms = (uint32_t)(deadline - now < 30000 ? deadline - now : 30000)};
            if (io.timeout_ms >= 1000 && tpu_initialize_system(c, &io, &t) == TPU_OK)
                break;
            /* NOT_FOUND: the cores are not all there yet (TensorFlow's "TPUs not
             * found in the cluster"); UNAVAILABLE: one failed during the reset */
            if (io.timeout_ms >= 1000 && tpu_last_status() != TPU_UNAVAILABLE && tpu_last_status() != TPU_NOT_FOUND)
                return failed("re-initializing the TPU system");
            if (io.timeout_ms >= 1000)
                printf("  initialize: %s: %s; trying again\n", tpu_status_name(tpu_last_status()), tpu_last_error());
        } else if (live != said && live < want) {
            if (live < 0)
                printf("  waiting for the resolver: %s\n", others);
            else
                printf("  waiting for %d live cores: %d now%s%s\n", want, live, *others ? "; not: " : "", others);
            said = live;
        }
        if (now_ms() >= deadline) {
            fprintf(stderr,
                    "fashion_mnist: the cluster did not have %d live cores again within %d s (%s); restart the "
                    "failed workers, or give more time with --recover-wait\n",
                    want, wait_s, *others ? others : "the initialize kept failing");
            return TPU_DEADLINE_EXCEEDED;
        }
        sleep_ms(500);
    }
    tpu_topology_free(*topology);
    *topology = t;
    if (tpu_topology_num_replicas(t) != want) {
        fprintf(stderr, "fashion_mnist: the new system has %d replicas, not %d\n", tpu_topology_num_replicas(t), want);
        return TPU_FAILED_PRECONDITION;
    }
    printf("  TPU system initialized again: epoch %llu, %d replicas, after %.1f s\n",
           (unsigned long long)tpu_topology_epoch(t), want, (double)(now_ms() - t0) / 1000.0);
    if (tpu_model_compile(m, co) != TPU_OK)
        return failed("compiling the model again");
    *resume = 0;
    if (access(ckpt, F_OK) != 0) {
        printf("  no checkpoint yet: training starts again from the first epoch\n");
        return TPU_OK;
    }
    if (tpu_model_load_checkpoint(m, ckpt) != TPU_OK)
        return failed("loading the checkpoint");
    *resume = 1;
    printf("  restored %s: epoch %d, batch %zu, step %llu\n", ckpt, tpu_model_epoch(m) + 1,
           tpu_model_batch_in_epoch(m), (unsigned long long)tpu_model_step(m));
    return TPU_OK;
}

/* epoch loss accuracy, one line per epoch, as hex floats (exact) */
static int write_history(const char *path, const tpu_history *h)
{
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "fashion_mnist: --history %s: cannot open it for writing\n", path);
        return 1;
    }
    for (size_t i = 0; i < tpu_history_num_epochs(h); i++) {
        tpu_logs lg;
        if (tpu_history_epoch(h, i, &lg) == TPU_OK)
            fprintf(f, "%d %a %a\n", lg.epoch, lg.loss, lg.accuracy);
    }
    return fclose(f) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *tpu = NULL, *data = DEFAULT_DATA, *logdir = "logs", *ckpt = NULL, *history_path = NULL;
    int epochs = 10, recover_max = 0, recover_wait = 120, elastic = 0, elastic_wait = 30;
    tpu_elastic_batch elastic_batch = TPU_ELASTIC_KEEP_GLOBAL_BATCH;
    long ckpt_every = 0;
    float lr = 0, decay_rate = 0.7f;
    int warmup_epochs = 1, deterministic = 0, cnn = 0, input = 0; /* 0 memory, 1 hosts, 2 client */
    unsigned long long seed = 42;
    tpu_set_warning_handler(tpu_warning_to_file, stderr); /* the library itself never prints */
    enum { SCHED_COSINE, SCHED_EXPONENTIAL, SCHED_CONSTANT } sched = SCHED_COSINE;

    setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines as they happen, also into a pipe */

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return usage(NULL), 0;
        if (!strcmp(a, "--deterministic")) {
            deterministic = 1;
            continue;
        }
        if (i + 1 >= argc)
            return usage("a flag needs a value");
        if (!strcmp(a, "--tpu"))
            tpu = argv[++i];
        else if (!strcmp(a, "--data"))
            data = argv[++i];
        else if (!strcmp(a, "--logdir"))
            logdir = argv[++i];
        else if (!strcmp(a, "--history"))
            history_path = argv[++i];
        else if (!strcmp(a, "--input")) {
            const char *v = argv[++i];
            if (!strcmp(v, "memory"))
                input = 0;
            else if (!strcmp(v, "hosts"))
                input = 1;
            else if (!strcmp(v, "client"))
                input = 2;
            else
                return usage("--input is memory, hosts or client");
        } else if (!strcmp(a, "--model")) {
            const char *v = argv[++i];
            if (!strcmp(v, "cnn"))
                cnn = 1;
            else if (strcmp(v, "mlp"))
                return usage("--model is mlp or cnn");
        } else if (!strcmp(a, "--learning-rate")) {
            char *end;
            lr = strtof(argv[++i], &end);
            if (*end || !(lr > 0))
                return usage("--learning-rate: a positive number");
        } else if (!strcmp(a, "--lr-schedule")) {
            const char *v = argv[++i];
            if (!strcmp(v, "cosine"))
                sched = SCHED_COSINE;
            else if (!strcmp(v, "exponential"))
                sched = SCHED_EXPONENTIAL;
            else if (!strcmp(v, "constant"))
                sched = SCHED_CONSTANT;
            else
                return usage("--lr-schedule: cosine, exponential or constant");
        } else if (!strcmp(a, "--decay-rate")) {
            char *end;
            decay_rate = strtof(argv[++i], &end);
            if (*end || !(decay_rate > 0 && decay_rate <= 1))
                return usage("--decay-rate: a number in (0, 1]");
        } else if (!strcmp(a, "--seed")) {
            char *end;
            seed = strtoull(argv[++i], &end, 10);
            if (*end || argv[i][0] == '-' || !argv[i][0])
                return usage("--seed: a number from 0 to 2^64-1");
        } else if (!strcmp(a, "--warmup-epochs")) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 0 || v > 1000)
                return usage("--warmup-epochs: a number from 0 to 1000");
            warmup_epochs = (int)v;
        } else if (!strcmp(a, "--epochs")) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 1000)
                return usage("--epochs: a number from 1 to 1000");
            epochs = (int)v;
        } else if (!strcmp(a, "--checkpoint")) {
            ckpt = argv[++i];
            if (!*ckpt)
                return usage("--checkpoint: a file name");
        } else if (!strcmp(a, "--elastic-batch")) {
            const char *v = argv[++i];
            if (!strcmp(v, "global"))
                elastic_batch = TPU_ELASTIC_KEEP_GLOBAL_BATCH;
            else if (!strcmp(v, "per-replica"))
                elastic_batch = TPU_ELASTIC_KEEP_PER_REPLICA_BATCH;
            else
                return usage("--elastic-batch: global or per-replica");
        } else if (!strcmp(a, "--checkpoint-every") || !strcmp(a, "--recover") || !strcmp(a, "--recover-wait") ||
                   !strcmp(a, "--elastic") || !strcmp(a, "--elastic-wait")) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            long most = !strcmp(a, "--checkpoint-every") ? 1000000 : !strcmp(a, "--recover") ? 100
                        : !strcmp(a, "--elastic")        ? 1000
                                                         : 3600;
            if (*end || v < 1 || v > most) {
                char why[96];
                snprintf(why, sizeof why, "%s: a number from 1 to %ld", a, most);
                return usage(why);
            }
            if (!strcmp(a, "--checkpoint-every"))
                ckpt_every = v;
            else if (!strcmp(a, "--recover"))
                recover_max = (int)v;
            else if (!strcmp(a, "--recover-wait"))
                recover_wait = (int)v;
            else if (!strcmp(a, "--elastic"))
                elastic = (int)v;
            else
                elastic_wait = (int)v;
        } else
            return usage("unknown flag");
    }
    if (ckpt_every && !ckpt)
        return usage("--checkpoint-every needs --checkpoint FILE");
    if (recover_max && !ckpt)
        return usage("--recover needs --checkpoint FILE to go on from");
    if (recover_max && elastic)
        return usage("--recover and --elastic are two ways to survive a lost core: choose one");

    /* data */
    float *x_train = NULL, *x_test;
    int32_t *y_train = NULL, *y_test;
    size_t n_train = 0, n_test;
    if ((!input && load(data, "train", &x_train, &y_train, &n_train)) || load(data, "t10k", &x_test, &y_test, &n_test))
        return 1;

    /* 1. TPU setup */
    tpu_resolver *resolver;
    tpu_cluster *cluster;
    tpu_topology *topology;
    tpu_strategy *strategy;
    if (tpu_resolver_new(tpu, &resolver) != TPU_OK)
        return fail("resolving the TPU");
    if (tpu_connect_to_cluster(resolver, &cluster) != TPU_OK)
        return fail("connecting to the cluster");
    /* with --recover or --elastic, a core lost during this first initialize
     * is waited for too (up to 10 tries, 1 s apart) */
    for (int tries = 1;; tries++) {
        if (tpu_initialize_system(cluster, NULL, &topology) == TPU_OK)
            break;
        tpu_status ist = tpu_last_status(); /* NOT_FOUND: a core not back yet */
        if ((ist != TPU_UNAVAILABLE && ist != TPU_NOT_FOUND) || !(recover_max || elastic) || tries >= 10)
            return fail("initializing the TPU system");
        printf("initializing the TPU system: %s; trying again\n", tpu_last_error());
        sleep_ms(1000);
    }
    if (tpu_strategy_new(cluster, &strategy) != TPU_OK)
        return fail("making the strategy");
    int replicas = tpu_strategy_num_replicas_in_sync(strategy);
    printf("Running on %s with %d replicas (%s)\n", tpu_resolver_master(resolver), replicas,
           tpu_topology_tpu_type(topology));

    /* 2. performance settings */
    size_t batch_size = 128 * (size_t)replicas;

    /* 3. the input pipeline */
    tpu_dataset *train, *test;
    if (!input) {
        if (tpu_dataset_from_tensor_slices(x_train, n_train, 784, y_train, TPU_LABELS_SPARSE, 1, TPU_BORROW, &train) ||
            tpu_dataset_shuffle(train, n_train, 1) || tpu_dataset_batch(train, batch_size, 1) ||
            tpu_dataset_prefetch(train, TPU_AUTOTUNE))
            return fail("building the training dataset");
    } else { /* what each input pipeline does with its shard of the files */
        char img[4096], lab[4096];
        tpu_file_dataset *fd;
        snprintf(img, sizeof img, "%s/train-images-idx3-ubyte.gz", data);
        snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte.gz", data);
        if (tpu_file_dataset_from_idx(img, lab, &fd))
            return fail("reading the training files' headers");
        n_train = tpu_file_dataset_num_rows(fd);
        if (tpu_file_dataset_map(fd, TPU_MAP_SCALE, 1.0f / 255.0f, 0) || tpu_file_dataset_cache(fd) ||
            tpu_file_dataset_shuffle(fd, n_train, 1) || tpu_file_dataset_batch(fd, 128, 1) ||
            tpu_file_dataset_prefetch(fd, 2) ||
            tpu_strategy_distribute_datasets_from_files(strategy, fd,
                                                        input == 1 ? TPU_INPUT_ON_HOSTS : TPU_INPUT_ON_CLIENT, &train))
            return fail("building the training dataset");
        tpu_file_dataset_free(fd);
        printf("input pipelines: %d, one per replica, run by %s\n", replicas,
               input == 1 ? "each core's host (no training rows through the client)" : "the client");
    }
    if (tpu_dataset_from_tensor_slices(x_test, n_test, 784, y_test, TPU_LABELS_SPARSE, 1, TPU_BORROW, &test) ||
        tpu_dataset_batch(test, batch_size, 0) || tpu_dataset_prefetch(test, TPU_AUTOTUNE))
        return fail("building the test dataset");

    /* 4. the model, in the strategy */
    tpu_model *model;
    tpu_compile_options co;
    char summary[2048];
    if (tpu_model_new(strategy, 784, &model))
        return fail("building the model");
    if (cnn &&
        (tpu_model_set_input_shape(model, (size_t[]){28, 28, 1}, 3) || tpu_model_add_batch_normalization(model, 0, 0) ||
         tpu_model_add_conv2d(model, 32, 3, 3, 1, 1, TPU_PADDING_SAME, TPU_ACT_RELU) ||
         tpu_model_add_max_pooling2d(model, 2, 2, 0, 0, TPU_PADDING_VALID) ||
         tpu_model_add_batch_normalization(model, 0, 0) ||
         tpu_model_add_conv2d(model, 64, 3, 3, 1, 1, TPU_PADDING_SAME, TPU_ACT_RELU) ||
         tpu_model_add_max_pooling2d(model, 2, 2, 0, 0, TPU_PADDING_VALID) || tpu_model_add_dropout(model, 0.25f) ||
         tpu_model_add_flatten(model)))
        return fail("building the model");
    if (tpu_model_add_dense(model, 128, TPU_ACT_RELU) || (cnn && tpu_model_add_dropout(model, 0.5f)) ||
        tpu_model_add_dense(model, 10, TPU_ACT_SOFTMAX) || tpu_model_set_seed(model, (uint64_t)seed))
        return fail("building the model");
    tpu_compile_options_init(&co);
    /* A global batch k times Keras' 128 takes k times fewer steps per epoch.
     * The recipe for that: scale Keras' default learning rate (Adam's 0.001
     * at batch 32) linearly with the batch, warm it up over the first epoch,
     * and decay it along a cosine to 0 by the last step (Keras' CosineDecay
     * with warmup_target). The constant schedule keeps the gentler
     * square-root rule, which is stable without a warm-up. */
    uint64_t steps_per_epoch = tpu_dataset_num_batches(train), total = steps_per_epoch * (uint64_t)epochs;
    uint64_t warmup = steps_per_epoch * (uint64_t)(warmup_epochs < epochs ? warmup_epochs : epochs - 1);
    if (!(lr > 0))
        lr = sched == SCHED_CONSTANT ? 0.001f * sqrtf((float)batch_size / 128.0f)
                                     : 0.001f * (float)batch_size / 32.0f;
    if (sched == SCHED_COSINE) {
        co.optimizer = tpu_optimizer_adam_schedule(
            warmup ? tpu_cosine_decay_warmup(0.0f, total - warmup, 0.0f, lr, warmup) : tpu_cosine_decay(lr, total, 0.0f));
        printf("global batch %zu (128 x %d replicas), mixed_bfloat16, Adam(CosineDecay(0, decay_steps=%llu, "
               "warmup_target=%.4g, warmup_steps=%llu))%s\n",
               batch_size, replicas, (unsigned long long)(total - warmup), (double)lr, (unsigned long long)warmup,
               deterministic ? ", deterministic" : "");
    } else if (sched == SCHED_EXPONENTIAL) {
        co.optimizer = tpu_optimizer_adam_schedule(tpu_exponential_decay(lr, steps_per_epoch, decay_rate, 0));
        printf("global batch %zu (128 x %d replicas), mixed_bfloat16, Adam(ExponentialDecay(%.4g, decay_steps=%llu, "
               "decay_rate=%.3g))%s\n",
               batch_size, replicas, (double)lr, (unsigned long long)steps_per_epoch, (double)decay_rate,
               deterministic ? ", deterministic" : "");
    } else {
        co.optimizer = tpu_optimizer_adam(lr);
        printf("global batch %zu (128 x %d replicas), mixed_bfloat16, Adam(learning_rate=%.4g)%s\n", batch_size,
               replicas, (double)lr, deterministic ? ", deterministic" : "");
    }
    co.deterministic = deterministic;
    co.loss = TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY;
    co.metrics_accuracy = 1;
    co.policy = TPU_POLICY_MIXED_BFLOAT16;
    co.batch_size = batch_size;
    if (tpu_model_compile(model, &co) != TPU_OK)
        return fail("compiling the model");
    tpu_model_summary(model, summary, sizeof summary);
    fputs(summary, stdout);

    /* 5. train with profiling (and checkpoints) */
    tpu_callback cbs[3];
    tpu_fit_options fo;
    size_t ncb = 2;
    if (tpu_callback_progress(stdout, &cbs[0]) || tpu_callback_tensorboard(logdir, 10, 20, &cbs[1]) ||
        tpu_callback_profiler_report(&cbs[1], stdout))
        return fail("making the callbacks");
    if (ckpt && tpu_callback_checkpoint(ckpt, (uint64_t)ckpt_every, &cbs[ncb++]))
        return fail("making the checkpoint callback");
    memset(&fo, 0, sizeof fo);
    fo.epochs = epochs;
    fo.callbacks = cbs;
    fo.num_callbacks = ncb;
    fo.preemption_checkpoint = ckpt;
    fo.elastic.max_losses = elastic;
    fo.elastic.wait_ms = (uint32_t)elastic_wait * 1000u;
    fo.elastic.batch = elastic_batch;
    fo.elastic.checkpoint = ckpt;
    if (ckpt && access(ckpt, F_OK) == 0) { /* started again after a preemption (or any stop) */
        if (tpu_model_load_checkpoint(model, ckpt) != TPU_OK)
            return fail("loading the checkpoint to resume from");
        fo.resume = 1;
        printf("resuming from %s: epoch %d, batch %zu, step %llu\n", ckpt, tpu_model_epoch(model) + 1,
               tpu_model_batch_in_epoch(model), (unsigned long long)tpu_model_step(model));
    }

    double loss = 0, accuracy = 0;
    int exit_code = 0;
    for (int recoveries = 0;;) {
        tpu_history *history = NULL;
        tpu_status st = tpu_model_fit(model, train, &fo, elastic || history_path ? &history : NULL);
        if (history_path && write_history(history_path, history) != 0)
            return 1;
        for (size_t i = 0; i < tpu_history_num_events(history); i++) {
            tpu_elastic_event ev;
            tpu_history_event(history, i, &ev);
            printf("elastic event %zu: %s at step %llu: %d -> %d replicas, global batch %zu -> %zu, from step "
                   "%llu (%s), %.1f s: %s\n",
                   i + 1, tpu_elastic_event_kind_name(ev.kind), (unsigned long long)ev.step, ev.replicas_before,
                   ev.replicas_after, ev.global_batch_before, ev.global_batch_after,
                   (unsigned long long)ev.restored_step, ev.from, ev.seconds, ev.cause);
        }
        tpu_history_free(history);
        const char *what = "training";
        if (st == TPU_OK) {
            what = "evaluating";
            st = tpu_model_evaluate(model, test, &loss, &accuracy);
        }
        if (st == TPU_OK)
            break;
        fail(what); /* UNAVAILABLE names the core: "core host1/3 ..." */
        if (st == TPU_PREEMPTED) {
            printf("preempted: exiting with status %d; start again with the same flags to go on\n", EXIT_PREEMPTED);
            exit_code = EXIT_PREEMPTED; /* after the clean-up below */
            break;
        }
        do {
            if (st != TPU_UNAVAILABLE || recoveries >= recover_max)
                return 1;
            recoveries++;
            printf("recovering (%d of %d) from %s's failure\n", recoveries, recover_max, what);
        } while ((st = recover(cluster, &topology, model, &co, ckpt, replicas, recover_wait, &fo.resume)) != TPU_OK);
        if (!*tpu_callback_profiler_dir(&cbs[1])) { /* its batches start again after the resume */
            tpu_callback_free(&cbs[1]);
            if (tpu_callback_tensorboard(logdir, 10, 20, &cbs[1]) || tpu_callback_profiler_report(&cbs[1], stdout))
                return fail("making the TensorBoard callback");
        }
    }
    if (!exit_code && *tpu_callback_profiler_dir(&cbs[1]))
        printf("profile of batches 10-20 in %s (the .trace.json.gz opens in Perfetto, chrome://tracing or "
               "speedscope; steps.svg in a browser); tensorboard --logdir %s shows it and the epoch scalars\n",
               tpu_callback_profiler_dir(&cbs[1]), logdir);
    if (!exit_code)
        printf("test loss: %.4f\ntest accuracy: %.4f\n", loss, accuracy);

    for (size_t i = 0; i < ncb; i++)
        tpu_callback_free(&cbs[i]);
    tpu_model_free(model);
    tpu_dataset_free(train);
    tpu_dataset_free(test);
    tpu_strategy_free(strategy);
    tpu_topology_free(topology);
    tpu_cluster_free(cluster);
    tpu_resolver_free(resolver);
    free(x_train), free(y_train), free(x_test), free(y_test);
    return exit_code;
}
