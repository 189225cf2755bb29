/* The core's kernels beyond the Dense stack's first five activations and
 * probability losses (internal to model.c): the activations gelu, softplus
 * and swish, the cross-entropies from logits, and the normalization layers
 * LayerNormalization and BatchNormalization, forward and backward, as Keras
 * defines them. Every loop runs in a fixed order and every sum in float32
 * left to right, so the results depend on the inputs alone; det selects the
 * host-independent exp and log of detmath.h. */
#ifndef TPUEMU_WORKER_NORM_H
#define TPUEMU_WORKER_NORM_H

#include <stddef.h>

#include "model.h"

/* v = act(v + b) row by row (rows x n) for ACT_GELU, ACT_SOFTPLUS and
 * ACT_SWISH, keeping v + b in pre for the backward pass:
 *   gelu:     0.5 z (1 + erf(z / sqrt 2))       (Keras' approximate=False)
 *   softplus: log(1 + exp(z)), as max(z, 0) + log(1 + exp(-|z|))
 *   swish:    z sigmoid(z) */
void actx_forward(float *v, const float *b, int rows, int n, enum model_act act, int det, float *pre);
/* d = dL/da -> dL/dz in place from the kept pre-activations. */
void actx_backward(float *d, const float *pre, size_t len, enum model_act act, int det);

/* One row's cross-entropy of logits z (n of them) through a log-softmax
 * computed stably (z - max(z) - log(sum(exp(z - max(z))))), as
 * tf.nn.(sparse_)softmax_cross_entropy_with_logits does:
 *   LOSS_SPARSE_CCE: loss = lse(z) - z_cls;              g = softmax(z) - onehot(cls)
 *   LOSS_CCE:        loss = sum_j y_j (lse(z) - z_j);    g = softmax(z) sum(y) - y
 * g (not NULL) gets dL/dz. */
float logits_row_loss(enum model_loss loss, const float *z, int n, const float *y, int cls, float *g, int det);

#endif
