/* The sequence layers of the emulated core: Embedding (with keras_nlp's
 * learned position embedding as an option), GlobalAveragePooling1D and
 * MultiHeadAttention (Keras' layer, self-attention on a (sequence, features)
 * input), forward and backward. model.c dispatches to them; they reach the
 * matrix unit through the model's matmul (seq_mm), so every product is timed,
 * counted and recorded for the profiler like a Dense layer's.
 *
 * MultiHeadAttention's weights, in Keras' order: query kernel (features,
 * heads, key_dim), query bias (heads, key_dim), key kernel and bias, value
 * kernel (features, heads, value_dim) and bias, output kernel (heads,
 * value_dim, features) and bias (features); read as matrices they are
 * features x heads*key_dim and so on, heads outermost. The forward pass:
 *   Q = (x Wq + bq) / sqrt(key_dim), K = x Wk + bk, V = x Wv + bv
 *   per head h: P_h = softmax(Q_h K_h^T) (over the keys), O_h = P_h V_h
 *   y = concat_h(O_h) Wo + bo
 * Lowered to matmuls as XLA lowers the einsums: four projections of
 * rows*sequence x features, and per (example, head) the two attention
 * products, run as one batched matmul each (recorded as one matmul of
 * batch*sequence rows). Every loop runs in a fixed order. */
#ifndef TPUEMU_WORKER_ATTENTION_H
#define TPUEMU_WORKER_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "layershape.h"
#include "status.h"

/* The model's matmul: batch products C_i = op(A_i) op(B_i) (+ C_i when acc),
 * A_i = a + i*sa and so on, recorded for the profiler as layer's matmul op
 * (0 forward, 1 weight gradient, 2 input gradient). */
struct seq_mm {
    int (*fn)(void *ctx, int op, int64_t batch, int64_t M, int64_t N, int64_t K, int ta, int tb, const float *a,
              int64_t sa, const float *b, int64_t sb, float *c, int64_t sc, int acc, err *e);
    void *ctx;
    int det; /* exp from detmath.h */
};

/* A matmul a layer runs per step: batch x (M x K . K x N). */
struct seq_shape {
    int op;
    int64_t batch, m, n, k;
};

/* ---- Embedding ---- */

/* out[r, s, :] = table[x[r, s], :] (+ pos[s, :]); CODE_INVALID_ARGUMENT
 * naming the row and position for an id that is not an integer in
 * 0..vocab-1. w: the layer's weights (the table, then the positions). */
int embed_forward(const struct lspec *sp, const struct lshape *in, const float *w, const float *x, int rows, float *out,
                  err *e);
/* The weights' gradient of dy (rows x seq x dim): zeroed, then each row of
 * dy added into its token's row of the table (and its position's). */
void embed_backward(const struct lspec *sp, const struct lshape *in, const float *x, int rows, const float *dy,
                    float *gw);
/* RandomUniform(-0.05, 0.05), Keras' "uniform", for every value, from key. */
void embed_init(float *w, size_t n, uint64_t key);

/* ---- MultiHeadAttention ---- */

typedef struct attn attn;
/* Buffers for max_rows rows. NULL when out of memory. */
attn *attn_new(const struct lspec *sp, const struct lshape *in, int max_rows);
void attn_free(attn *a);
/* y = MHA(x, x) over rows rows; keeps what backward needs (x is read again
 * there: it must stay unchanged). */
int attn_forward(attn *a, const struct seq_mm *mm, const float *w, const float *x, int rows, float *y, err *e);
/* From dy: the weights' gradient into gw, and dx (NULL: not needed). */
int attn_backward(attn *a, const struct seq_mm *mm, const float *w, const float *x, int rows, const float *dy,
                  float *gw, float *dx, err *e);
/* Glorot-uniform kernels with Keras' fans for its einsum kernels (a kernel
 * (a, b, c) has fan_in a*b... as keras.initializers computes it), zero
 * biases. value i of the block from key. */
void attn_init(const struct lspec *sp, const struct lshape *in, float *w, uint64_t key);
/* The matmuls of a forward pass (train 0) or of a backward pass (train 1)
 * over rows rows: into out (room for 16), their count returned. */
int attn_shapes(const struct lspec *sp, const struct lshape *in, int rows, int train, int first, struct seq_shape *out);

#endif
