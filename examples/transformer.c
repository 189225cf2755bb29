/* A small transformer encoder classifier on the emulated pod, as a Keras user
 * writes one for text classification with keras_nlp:
 *
 *   inputs = keras.Input(shape=(16,), dtype="int32")
 *   x = keras_nlp.layers.TokenAndPositionEmbedding(32, 16, 32)(inputs)
 *   a = layers.MultiHeadAttention(num_heads=2, key_dim=16)(x, x)
 *   x = layers.LayerNormalization(epsilon=1e-5)(layers.Add()([x, a]))
 *   f = layers.Dense(64, activation="relu")(x)
 *   f = layers.Dense(32)(f)
 *   x = layers.LayerNormalization(epsilon=1e-5)(layers.Add()([x, f]))
 *   x = layers.GlobalAveragePooling1D()(x)
 *   outputs = layers.Dense(4, activation="softmax")(x)
 *
 * (the encoder block is keras_nlp's TransformerEncoder(64, 2): attention,
 * residual, normalization, feed-forward, residual, normalization), trained
 * with Adam under mixed_bfloat16 on every core of the TPU system.
 *
 *   transformer [--tpu ADDR] [--epochs N] [--seed N] [--deterministic] [--no-attention]
 *
 * The data are synthetic, seeded: sequences of 16 token ids from a
 * vocabulary of 32. Each of the tokens 4, 5, 6 and 7 is in a sequence or not
 * (even odds, at a random place), fillers 8..31 fill the rest, and the class
 * is 2 x (exactly one of 4 and 5 is there) + (exactly one of 6 and 7): an
 * exclusive or of what two positions hold. Without attention every position
 * is transformed on its own and the pooling adds them up, so the classifier
 * sees a sum of per-token terms, from which no linear layer can read an
 * exclusive or: --no-attention builds that model (the same one without the
 * attention layer, its residual and its normalization) and it stays at
 * chance, 0.25. With attention a token can look for its partner, and the
 * model reaches about 1.0. 8,192 training sequences, 2,048 test ones, a
 * global batch of 64 per replica, Adam(0.002). It prints the summary, each epoch's progress, the
 * training time and the test accuracy ("test accuracy: 1.0000").
 *
 * It uses only the public API (tpuemu/model.h, tpuemu/data.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tpuemu/data.h>
#include <tpuemu/model.h>
#include <tpuemu/tpuemu.h>

#define SEQ 16
#define VOCAB 32
#define DIM 32
#define CLASSES 4
#define N_TRAIN 8192
#define N_TEST 2048

static int fail(const char *what)
{
    fprintf(stderr, "transformer: %s: %s: %s\n", what, tpu_status_name(tpu_last_status()), tpu_last_error());
    return 1;
}

static uint64_t sm64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* n sequences of token ids (as floats, the model's input rows) and their
 * classes: each of the tokens 4, 5, 6 and 7 is in a sequence or not (even
 * odds, at a random place), fillers 8..31 elsewhere; the class is
 * 2 x (exactly one of 4 and 5 is there) + (exactly one of 6 and 7). */
static void sequences(size_t n, uint64_t seed, float *x, int32_t *y)
{
    for (size_t i = 0; i < n; i++) {
        float *t = x + i * SEQ;
        int has[4];
        for (int p = 0; p < SEQ; p++)
            t[p] = (float)(8 + sm64(&seed) % (VOCAB - 8));
        for (int k = 0; k < 4; k++) {
            has[k] = (int)(sm64(&seed) % 2);
            if (has[k]) {
                int p;
                do
                    p = (int)(sm64(&seed) % SEQ);
                while (t[p] < 8.0f);
                t[p] = (float)(4 + k);
            }
        }
        y[i] = 2 * (has[0] ^ has[1]) + (has[2] ^ has[3]);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *tpu = NULL;
    int epochs = 20, deterministic = 0, attention = 1;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tpu") && i + 1 < argc)
            tpu = argv[++i];
        else if (!strcmp(argv[i], "--epochs") && i + 1 < argc)
            epochs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--deterministic"))
            deterministic = 1;
        else if (!strcmp(argv[i], "--no-attention"))
            attention = 0;
        else {
            int help = !strcmp(argv[i], "--help");
            fprintf(help ? stdout : stderr,
                    "usage: transformer [--tpu ADDR] [--epochs N] [--seed N] [--deterministic] [--no-attention]\n");
            return help ? 0 : 2;
        }
    }
    if (epochs < 1 || epochs > 1000) {
        fprintf(stderr, "transformer: --epochs %d is outside 1..1000\n", epochs);
        return 2;
    }

    static float x_train[N_TRAIN * SEQ], x_test[N_TEST * SEQ];
    static int32_t y_train[N_TRAIN], y_test[N_TEST];
    sequences(N_TRAIN, seed, x_train, y_train);
    sequences(N_TEST, seed + 1000003, x_test, y_test);

    /* the TPU system and the strategy */
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
    size_t batch_size = 64 * (size_t)replicas;
    printf("Running on %s with %d replicas (%s)\n", tpu_resolver_master(resolver), replicas,
           tpu_topology_tpu_type(topology));

    /* the input pipeline */
    tpu_dataset *train, *test;
    if (tpu_dataset_from_tensor_slices(x_train, N_TRAIN, SEQ, y_train, TPU_LABELS_SPARSE, 1, TPU_BORROW, &train) ||
        tpu_dataset_shuffle(train, N_TRAIN, seed) || tpu_dataset_batch(train, batch_size, 1) ||
        tpu_dataset_prefetch(train, TPU_AUTOTUNE))
        return fail("making the training dataset");
    if (tpu_dataset_from_tensor_slices(x_test, N_TEST, SEQ, y_test, TPU_LABELS_SPARSE, 1, TPU_BORROW, &test) ||
        tpu_dataset_batch(test, batch_size, 0) || tpu_dataset_prefetch(test, TPU_AUTOTUNE))
        return fail("making the test dataset");

    /* the model: embedding, one encoder block, pooling, the classifier */
    tpu_model *model;
    tpu_compile_options co;
    char summary[4096];
    size_t ff = attention ? 4 : 1; /* the feed-forward's first layer */
    if (tpu_model_new(strategy, SEQ, &model) || tpu_model_set_seed(model, seed) ||
        tpu_model_add_token_and_position_embedding(model, VOCAB, DIM)) /* layer 0 */
        return fail("building the model");
    if (attention && (tpu_model_add_multi_head_attention(model, 2, DIM / 2, 0) || /* 1 */
                      tpu_model_add_residual(model, 1) ||                         /* 2: x + attention(x) */
                      tpu_model_add_layer_normalization(model, 1e-5f)))           /* 3 */
        return fail("building the model");
    if (tpu_model_add_dense(model, 64, TPU_ACT_RELU) ||    /* 4 */
        tpu_model_add_dense(model, DIM, TPU_ACT_LINEAR) || /* 5 */
        tpu_model_add_residual(model, ff) ||               /* 6: x + feed_forward(x) */
        tpu_model_add_layer_normalization(model, 1e-5f) || /* 7 */
        tpu_model_add_global_average_pooling1d(model) || tpu_model_add_dense(model, CLASSES, TPU_ACT_SOFTMAX))
        return fail("building the model");
    tpu_compile_options_init(&co);
    co.optimizer = tpu_optimizer_adam(0.002f);
    co.loss = TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY;
    co.metrics_accuracy = 1;
    co.policy = TPU_POLICY_MIXED_BFLOAT16;
    co.batch_size = batch_size;
    co.deterministic = deterministic;
    if (tpu_model_compile(model, &co) != TPU_OK)
        return fail("compiling the model");
    tpu_model_summary(model, summary, sizeof summary);
    fputs(summary, stdout);

    /* train, then evaluate on the test sequences */
    tpu_callback progress;
    tpu_fit_options fo;
    double loss, accuracy, t0 = now_s();
    if (tpu_callback_progress(stdout, &progress))
        return fail("making the progress callback");
    memset(&fo, 0, sizeof fo);
    fo.epochs = epochs;
    fo.callbacks = &progress;
    fo.num_callbacks = 1;
    if (tpu_model_fit(model, train, &fo, NULL) != TPU_OK)
        return fail("training");
    double secs = now_s() - t0;
    if (tpu_model_evaluate(model, test, &loss, &accuracy) != TPU_OK)
        return fail("evaluating");
    printf("trained %d epochs in %.1f s\n", epochs, secs);
    printf("test loss: %.4f\n", loss);
    printf("test accuracy: %.4f\n", accuracy);

    tpu_callback_free(&progress);
    tpu_model_free(model);
    tpu_dataset_free(train);
    tpu_dataset_free(test);
    tpu_strategy_free(strategy);
    tpu_topology_free(topology);
    tpu_cluster_free(cluster);
    tpu_resolver_free(resolver);
    return 0;
}
