/* The TensorFlow tutorial "Custom training with tf.distribute.Strategy", in C,
 * on the emulated pod, with the walk-through's model: resolve the TPU,
 * initialize the TPU system, make the strategy, distribute the Fashion-MNIST
 * datasets over the replicas (global batch 128 x num_replicas_in_sync), and
 * train Dense(128, relu) -> Dense(10, softmax) with Adam and sparse
 * categorical cross-entropy in a loop of its own:
 *
 *   for epoch in range(EPOCHS):
 *     for x in train_dist_dataset:
 *       per_replica_losses = strategy.run(train_step, args=(x,))
 *       total_loss += strategy.reduce(SUM, per_replica_losses, axis=None)
 *     for x in test_dist_dataset:
 *       strategy.run(test_step, args=(x,))
 *     print("Epoch {}, Loss: {}, Accuracy: {}, Test Loss: {}, Test Accuracy: {}")
 *
 *   fashion_mnist_ctl [--tpu ADDR] [--epochs N] [--steps N] [--data DIR] [--from-function]
 *
 * --steps N stops each epoch after N steps (a bounded run); --from-function
 * builds the training input with distribute_datasets_from_function (each
 * replica's own batches of 128) instead of experimental_distribute_dataset.
 * It prints "test accuracy: A" at the end. Only the public API is used. */
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
    fprintf(stderr, "fashion_mnist_ctl: %s: %s: %s\n", what, tpu_status_name(tpu_last_status()), tpu_last_error());
    return 1;
}

static int usage(const char *why)
{
    if (why)
        fprintf(stderr, "fashion_mnist_ctl: %s\n", why);
    fprintf(stderr, "usage: fashion_mnist_ctl [--tpu ADDR] [--epochs N] [--steps N] [--data DIR] [--from-function]\n"
                    "  --tpu ADDR    the TPU resolver, HOST:PORT (default $TPU_NAME, else 127.0.0.1:8470)\n"
                    "  --epochs N    epochs to train (default 10)\n"
                    "  --steps N     at most N training steps per epoch (default: the whole epoch)\n"
                    "  --data DIR    the Fashion-MNIST IDX files (default " DEFAULT_DATA ")\n"
                    "  --from-function  the training input from distribute_datasets_from_function\n");
    return 2;
}

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
        fprintf(stderr, "fashion_mnist_ctl: %s: expected N x 28 x 28 images and N labels\n", prefix);
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

/* the training data for distribute_datasets_from_function */
struct train_data {
    const float *x;
    const int32_t *y;
    size_t n, global_batch;
};

/* dataset_fn(input_context): each replica's batch of the global one */
static tpu_status dataset_fn(const tpu_input_context *ctx, void *user, tpu_dataset **out)
{
    const struct train_data *d = user;
    size_t per = tpu_input_context_per_replica_batch_size(ctx, d->global_batch);
    tpu_dataset *ds;
    if (!per)
        return tpu_last_status();
    if (tpu_dataset_from_tensor_slices(d->x, d->n, 784, d->y, TPU_LABELS_SPARSE, 1, TPU_BORROW, &ds) != TPU_OK)
        return tpu_last_status();
    if (tpu_dataset_shuffle(ds, d->n, 1) != TPU_OK || tpu_dataset_batch(ds, per, 1) != TPU_OK ||
        tpu_dataset_prefetch(ds, TPU_AUTOTUNE) != TPU_OK) {
        tpu_dataset_free(ds);
        return tpu_last_status();
    }
    *out = ds;
    return TPU_OK;
}

/* strategy.reduce(SUM, v, axis=None) of a scalar per replica */
static double reduce_sum(tpu_strategy *s, const tpu_per_replica *v)
{
    double out = NAN;
    size_t got;
    if (v && tpu_strategy_reduce(s, TPU_SUM, v, TPU_AXIS_NONE, &out, 1, &got) != TPU_OK)
        return NAN;
    return out;
}

int main(int argc, char **argv)
{
    const char *tpu = NULL, *data = DEFAULT_DATA;
    int epochs = 10, from_function = 0;
    long max_steps = 0;
    tpu_set_warning_handler(tpu_warning_to_file, stderr); /* the library itself never prints */

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return usage(NULL), 0;
        if (!strcmp(a, "--from-function")) {
            from_function = 1;
            continue;
        }
        if (i + 1 >= argc)
            return usage("a flag needs a value");
        if (!strcmp(a, "--tpu"))
            tpu = argv[++i];
        else if (!strcmp(a, "--data"))
            data = argv[++i];
        else if (!strcmp(a, "--epochs") || !strcmp(a, "--steps")) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 1000000)
                return usage(!strcmp(a, "--epochs") ? "--epochs: a number from 1 to 1000000"
                                                    : "--steps: a number from 1 to 1000000");
            if (!strcmp(a, "--epochs"))
                epochs = (int)v;
            else
                max_steps = v;
        } else
            return usage("unknown flag");
    }

    float *x_train, *x_test;
    int32_t *y_train, *y_test;
    size_t n_train, n_test;
    if (load(data, "train", &x_train, &y_train, &n_train) || load(data, "t10k", &x_test, &y_test, &n_test))
        return 1;

    /* the strategy */
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
    size_t global_batch = 128 * (size_t)replicas;
    printf("Running on %s with %d replicas, global batch %zu (%s)\n", tpu_resolver_master(resolver), replicas,
           global_batch, from_function ? "distribute_datasets_from_function" : "experimental_distribute_dataset");

    /* the distributed datasets */
    tpu_dataset *train = NULL, *test;
    tpu_dist_dataset *train_dist, *test_dist;
    struct train_data td = {x_train, y_train, n_train, global_batch};
    if (from_function) {
        if (tpu_strategy_distribute_datasets_from_function(strategy, dataset_fn, &td, &train_dist) != TPU_OK)
            return fail("distributing the training dataset");
    } else {
        if (tpu_dataset_from_tensor_slices(x_train, n_train, 784, y_train, TPU_LABELS_SPARSE, 1, TPU_BORROW, &train) ||
            tpu_dataset_shuffle(train, n_train, 1) || tpu_dataset_batch(train, global_batch, 1) ||
            tpu_dataset_prefetch(train, TPU_AUTOTUNE) ||
            tpu_strategy_experimental_distribute_dataset(strategy, train, &train_dist))
            return fail("distributing the training dataset");
    }
    if (tpu_dataset_from_tensor_slices(x_test, n_test, 784, y_test, TPU_LABELS_SPARSE, 1, TPU_BORROW, &test) ||
        tpu_dataset_batch(test, global_batch, 0) || tpu_dataset_prefetch(test, TPU_AUTOTUNE) ||
        tpu_strategy_experimental_distribute_dataset(strategy, test, &test_dist))
        return fail("distributing the test dataset");

    /* the model, in the strategy's scope */
    tpu_model *model;
    tpu_compile_options co;
    if (tpu_model_new(strategy, 784, &model) || tpu_model_add_dense(model, 128, TPU_ACT_RELU) ||
        tpu_model_add_dense(model, 10, TPU_ACT_SOFTMAX) || tpu_model_set_seed(model, 42))
        return fail("building the model");
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam(0.001f * sqrtf((float)global_batch / 128.0f));
    co.loss = TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY;
    co.metrics_accuracy = 1;
    co.policy = TPU_POLICY_MIXED_BFLOAT16;
    co.batch_size = global_batch;
    if (tpu_model_compile(model, &co) != TPU_OK)
        return fail("compiling the model");

    double test_loss = NAN, test_acc = NAN;
    for (int epoch = 0; epoch < epochs; epoch++) {
        double total_loss = 0, correct = 0, seen = 0;
        long steps = 0;
        tpu_dist_iter *it;
        tpu_per_replica *x;
        tpu_step_outputs o;

        /* train */
        if (tpu_dist_dataset_iter(train_dist, &it) != TPU_OK)
            return fail("iterating the training dataset");
        while (!max_steps || steps < max_steps) {
            if (tpu_dist_iter_next(it, &x) != TPU_OK)
                return fail("reading the training dataset");
            if (!x)
                break;
            tpu_status st = tpu_strategy_run(strategy, TPU_STEP_TRAIN, model, x, &o);
            tpu_per_replica_free(x);
            if (st != TPU_OK)
                return fail("a training step");
            total_loss += reduce_sum(strategy, o.loss); /* compute_average_loss per replica: SUM is the mean */
            correct += reduce_sum(strategy, o.correct);
            seen += reduce_sum(strategy, o.examples);
            tpu_step_outputs_free(&o);
            steps++;
        }
        tpu_dist_iter_free(it);

        /* test */
        double tl = 0, tc = 0, tn = 0;
        if (tpu_dist_dataset_iter(test_dist, &it) != TPU_OK)
            return fail("iterating the test dataset");
        for (;;) {
            if (tpu_dist_iter_next(it, &x) != TPU_OK)
                return fail("reading the test dataset");
            if (!x)
                break;
            tpu_status st = tpu_strategy_run(strategy, TPU_STEP_EVALUATE, model, x, &o);
            tpu_per_replica_free(x);
            if (st != TPU_OK)
                return fail("a test step");
            tl += reduce_sum(strategy, o.loss_sum);
            tc += reduce_sum(strategy, o.correct);
            tn += reduce_sum(strategy, o.examples);
            tpu_step_outputs_free(&o);
        }
        tpu_dist_iter_free(it);
        test_loss = tn > 0 ? tl / tn : NAN;
        test_acc = tn > 0 ? tc / tn : NAN;
        printf("Epoch %d, Steps: %ld, Loss: %.4f, Accuracy: %.4f, Test Loss: %.4f, Test Accuracy: %.4f\n", epoch + 1,
               steps, steps ? total_loss / (double)steps : NAN, seen > 0 ? correct / seen : NAN, test_loss, test_acc);
    }
    printf("test loss: %.4f\ntest accuracy: %.4f\n", test_loss, test_acc);

    tpu_model_free(model);
    tpu_dist_dataset_free(train_dist);
    tpu_dist_dataset_free(test_dist);
    tpu_dataset_free(train);
    tpu_dataset_free(test);
    tpu_strategy_free(strategy);
    tpu_topology_free(topology);
    tpu_cluster_free(cluster);
    tpu_resolver_free(resolver);
    free(x_train), free(y_train), free(x_test), free(y_test);
    return 0;
}
