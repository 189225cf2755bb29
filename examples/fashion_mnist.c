/* The TensorFlow TPU walk-through's "Putting It All Together", in C, on the
 * emulated pod: resolve the TPU, connect, initialize the TPU system, make the
 * strategy, use a global batch of 128 x num_replicas_in_sync with the
 * mixed_bfloat16 policy, batch and prefetch the dataset, build
 * Dense(128, relu) -> Dense(10, softmax) with Adam and sparse categorical
 * cross-entropy, and fit for 10 epochs with the profiler on batches 10-20.
 *
 *   fashion_mnist [--tpu ADDR] [--epochs N] [--data DIR] [--logdir DIR]
 *
 * It uses only the public API (tpuemu/model.h, tpuemu/data.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>
#include <tpuemu/tpuemu.h>

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

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
                    "  --tpu ADDR    the TPU resolver, HOST:PORT (default $TPU_NAME, else 127.0.0.1:8470)\n"
                    "  --epochs N    epochs to train (default 10)\n"
                    "  --data DIR    the Fashion-MNIST IDX files (default " DEFAULT_DATA ",\n"
                    "                Debian package dataset-fashion-mnist)\n"
                    "  --logdir DIR  where the profiler writes batches 10-20 (default logs)\n"
                    "  --learning-rate LR  Adam's (default 0.001 x sqrt(global batch / 128))\n");
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

int main(int argc, char **argv)
{
    const char *tpu = NULL, *data = DEFAULT_DATA, *logdir = "logs";
    int epochs = 10;
    float lr = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return usage(NULL), 0;
        if (i + 1 >= argc)
            return usage("a flag needs a value");
        if (!strcmp(a, "--tpu"))
            tpu = argv[++i];
        else if (!strcmp(a, "--data"))
            data = argv[++i];
        else if (!strcmp(a, "--logdir"))
            logdir = argv[++i];
        else if (!strcmp(a, "--learning-rate")) {
            char *end;
            lr = strtof(argv[++i], &end);
            if (*end || !(lr > 0))
                return usage("--learning-rate: a positive number");
        } else if (!strcmp(a, "--epochs")) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 1000)
                return usage("--epochs: a number from 1 to 1000");
            epochs = (int)v;
        } else
            return usage("unknown flag");
    }

    /* data */
    float *x_train, *x_test;
    int32_t *y_train, *y_test;
    size_t n_train, n_test;
    if (load(data, "train", &x_train, &y_train, &n_train) || load(data, "t10k", &x_test, &y_test, &n_test))
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
    if (tpu_initialize_system(cluster, NULL, &topology) != TPU_OK)
        return fail("initializing the TPU system");
    if (tpu_strategy_new(cluster, &strategy) != TPU_OK)
        return fail("making the strategy");
    int replicas = tpu_strategy_num_replicas_in_sync(strategy);
    printf("Running on %s with %d replicas (%s)\n", tpu_resolver_master(resolver), replicas,
           tpu_topology_tpu_type(topology));

    /* 2. performance settings */
    size_t batch_size = 128 * (size_t)replicas;

    /* 3. the input pipeline */
    tpu_dataset *train, *test;
    if (tpu_dataset_from_tensor_slices(x_train, n_train, 784, y_train, TPU_LABELS_SPARSE, 1, TPU_BORROW, &train) ||
        tpu_dataset_shuffle(train, n_train, 1) || tpu_dataset_batch(train, batch_size, 1) ||
        tpu_dataset_prefetch(train, TPU_AUTOTUNE))
        return fail("building the training dataset");
    if (tpu_dataset_from_tensor_slices(x_test, n_test, 784, y_test, TPU_LABELS_SPARSE, 1, TPU_BORROW, &test) ||
        tpu_dataset_batch(test, batch_size, 0) || tpu_dataset_prefetch(test, TPU_AUTOTUNE))
        return fail("building the test dataset");

    /* 4. the model, in the strategy */
    tpu_model *model;
    tpu_compile_options co;
    char summary[2048];
    if (tpu_model_new(strategy, 784, &model) || tpu_model_add_dense(model, 128, TPU_ACT_RELU) ||
        tpu_model_add_dense(model, 10, TPU_ACT_SOFTMAX) || tpu_model_set_seed(model, 42))
        return fail("building the model");
    tpu_compile_options_init(&co);
    /* A global batch k times Keras' 128 takes k times fewer steps per epoch;
     * the square-root rule scales Adam's learning rate to make up for it. */
    if (!(lr > 0))
        lr = 0.001f * sqrtf((float)batch_size / 128.0f);
    printf("global batch %zu (128 x %d replicas), mixed_bfloat16, Adam(learning_rate=%.4g)\n", batch_size, replicas,
           (double)lr);
    co.optimizer = tpu_optimizer_adam(lr);
    co.loss = TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY;
    co.metrics_accuracy = 1;
    co.policy = TPU_POLICY_MIXED_BFLOAT16;
    co.batch_size = batch_size;
    if (tpu_model_compile(model, &co) != TPU_OK)
        return fail("compiling the model");
    tpu_model_summary(model, summary, sizeof summary);
    fputs(summary, stdout);

    /* 5. train with profiling */
    tpu_callback cbs[2];
    tpu_fit_options fo;
    if (tpu_callback_progress(stdout, &cbs[0]) || tpu_callback_profiler(logdir, 10, 20, &cbs[1]))
        return fail("making the callbacks");
    memset(&fo, 0, sizeof fo);
    fo.epochs = epochs;
    fo.callbacks = cbs;
    fo.num_callbacks = 2;
    if (tpu_model_fit(model, train, &fo, NULL) != TPU_OK)
        return fail("training");
    if (*tpu_callback_profiler_dir(&cbs[1]))
        printf("profile of batches 10-20 in %s (open the .trace.json.gz in chrome://tracing or Perfetto)\n",
               tpu_callback_profiler_dir(&cbs[1]));

    double loss, accuracy;
    if (tpu_model_evaluate(model, test, &loss, &accuracy) != TPU_OK)
        return fail("evaluating");
    printf("test loss: %.4f\ntest accuracy: %.4f\n", loss, accuracy);

    tpu_callback_free(&cbs[0]);
    tpu_callback_free(&cbs[1]);
    tpu_model_free(model);
    tpu_dataset_free(train);
    tpu_dataset_free(test);
    tpu_strategy_free(strategy);
    tpu_topology_free(topology);
    tpu_cluster_free(cluster);
    tpu_resolver_free(resolver);
    free(x_train), free(y_train), free(x_test), free(y_test);
    return 0;
}
