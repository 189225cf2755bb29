/* The layers of a Sequential model and their shape rules, as Keras applies
 * them (per example, the batch axis left out): what each layer makes of its
 * input's shape, how many weights it holds, and its Keras names. Shared by
 * the emulated core (which runs the layers) and the client (which builds the
 * model, prints its summary and names its variables), so both agree.
 *
 * Shapes are per example: rank 1 (features), 2 (steps, features) or 3
 * (height, width, channels; NHWC as Keras' channels_last). Pure and
 * thread-safe. */
#ifndef TPUEMU_COMMON_LAYERSHAPE_H
#define TPUEMU_COMMON_LAYERSHAPE_H

#include <stddef.h>

#define LSHAPE_MAX_RANK 3
#define LSHAPE_MAX_DIM 65536
#define LSHAPE_MAX_SIZE (1 << 24)   /* floats per example, any layer */

/* The wire's numbering (proto LayerKind). Zero is Dense, so a model
 * description that names no kind is the Dense stack it always was. */
enum lkind {
    LK_DENSE = 0,
    LK_FLATTEN = 1,
    LK_CONV2D = 2,
    LK_MAX_POOL2D = 3,
    LK_AVG_POOL2D = 4,
    LK_GLOBAL_AVG_POOL2D = 5,
    LK_DROPOUT = 6,
    LK_RESHAPE = 7,
    LK_EMBEDDING = 8,
    LK_GLOBAL_AVG_POOL1D = 9,
    LK_MULTI_HEAD_ATTENTION = 10,
    LK_ADD = 11,
    LK_LAYER_NORM = 12,
    LK_BATCH_NORM = 13,
};
#define LK_LAST LK_BATCH_NORM

struct lshape {
    int rank;                   /* 1..3 */
    int d[LSHAPE_MAX_RANK];
};

struct lspec {
    enum lkind kind;
    int units;                  /* Dense: units; Conv2D: filters */
    int act;                    /* Dense, Conv2D: the activation (0 linear) */
    int kh, kw;                 /* Conv2D: kernel_size; pooling: pool_size */
    int sh, sw;                 /* strides; pooling: 0 = pool_size (Keras' None) */
    int same;                   /* padding "same" (1) or "valid" (0) */
    float rate;                 /* Dropout: fraction dropped, [0, 1) */
    struct lshape target;       /* Reshape: target_shape */
    int vocab;                  /* Embedding: input_dim (token ids 0..vocab-1); units is output_dim */
    int positions;              /* Embedding: plus a learned position embedding (keras_nlp's
                                   TokenAndPositionEmbedding) */
    int heads, key_dim, value_dim; /* MultiHeadAttention; value_dim 0 = key_dim */
    int from;                      /* Add: the layer whose input is added to this layer's input */
    float epsilon;                 /* LayerNormalization, BatchNormalization: > 0 (Keras: 1e-3) */
    float momentum;                /* BatchNormalization: [0, 1] (Keras: 0.99) */
    int synchronized;              /* BatchNormalization: batch statistics over every replica */
};

/* Number of floats in a shape. */
size_t lshape_size(const struct lshape *s);
/* "(None, 28, 28, 32)" into buf. */
void lshape_format(const struct lshape *s, char *buf, size_t n);

/* The output shape of layer s on input shape in, its kernel and bias sizes
 * (0 for layers without weights; the normalizations' gamma and beta), and the layer's effective strides (sh, sw
 * filled from the pool size when 0) and padding at the top and left
 * ("same": TensorFlow puts the odd pixel at the bottom and right).
 * -1 with why (naming the rule broken, e.g. "Conv2D needs a (height, width,
 * channels) input, not (None, 784)") for a layer that cannot take the input. */
struct lgeom {
    struct lshape out;
    size_t kernel, bias;
    /* non-trainable values after the bias: BatchNormalization's
     * moving_mean and moving_variance (2 x channels) */
    size_t stats;
    int sh, sw, pad_top, pad_left;
};
int lshape_apply(const struct lspec *s, const struct lshape *in, struct lgeom *g, char *why, size_t n);

/* "Conv2D" and its Keras variable prefix "conv2d" (the first of its kind;
 * later ones "conv2d_1", ...). */
const char *lkind_name(enum lkind k);
/* 1 when a mixed_bfloat16 model of these layers takes its input x only
 * through the matrix unit's bfloat16 rounding: its first layer after any
 * Flatten or Reshape is a Dense or a Conv2D. Such a model's infeed goes as
 * bfloat16 (half the bytes) and gives bitwise the same results as float32,
 * since rounding a bfloat16 value again changes nothing. */
int lspec_input_bf16(const struct lspec *layers, int n);
const char *lkind_prefix(enum lkind k);

#endif
