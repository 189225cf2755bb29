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

/* LayerNormalization(axis=-1) over npos positions of C features each:
 *   mean, var = the position's mean and (biased) variance
 *   xhat = (x - mean) / sqrt(var + eps);  y = gamma xhat + beta
 * keeping xhat (npos x C) and 1 / sqrt(var + eps) (npos) for the backward
 * pass, which adds to dgamma and dbeta (sum over positions of dy xhat and
 * dy) and, with dx, gives the input's gradient
 *   dx = rstd (g - mean(g) - xhat mean(g xhat)),  g = gamma dy. */
void ln_forward(const float *x, size_t npos, int C, float eps, const float *gamma, const float *beta, float *y,
                float *xhat, float *rstd);
void ln_backward(const float *dy, const float *xhat, const float *rstd, size_t npos, int C, const float *gamma,
                 float *dgamma, float *dbeta, float *dx);

/* BatchNormalization(axis=-1) over npos positions (rows x positions per
 * example) of C channels. Training: each channel's batch mean and biased
 * variance over the positions, kept in st (st[0..C) mean, st[C..2C) variance,
 * st[2C..3C) 1/sqrt(var + eps)); inference: the moving statistics mm, mv in
 * their place. y = gamma (x - mean) / sqrt(var + eps) + beta; xhat kept.
 * Backward: dgamma, dbeta set (not added: they are the layer's own), and
 * with dx the input's gradient; training:
 *   dx = gamma rstd (dy - mean(dy) - xhat mean(dy xhat))   (means over the positions)
 * inference: dx = gamma rstd dy. */
void bn_forward(const float *x, size_t npos, int C, float eps, int training, const float *gamma, const float *beta,
                const float *mm, const float *mv, float *y, float *xhat, float *st);
/* Synchronized: the same over every replica's positions: the sums go
 * through fn (st then also holds the global count at st[3C]); scratch holds
 * 2C + 2 floats. Nonzero (with e) when fn fails. */
int bn_forward_sync(const float *x, size_t npos, int C, float eps, const float *gamma, const float *beta, float *y,
                    float *xhat, float *st, float *scratch, model_allreduce_fn fn, void *ctx, err *e);
int bn_backward_sync(const float *dy, const float *xhat, const float *st, size_t npos, int C, const float *gamma,
                     float *dgamma, float *dbeta, float *dx, float *scratch, model_allreduce_fn fn, void *ctx, err *e);
void bn_backward(const float *dy, const float *xhat, const float *st, size_t npos, int C, int training,
                 const float *gamma, float *dgamma, float *dbeta, float *dx);

#endif
