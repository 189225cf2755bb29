/* reduce: the element-wise kernels of the collectives (float32 sum/max/min,
 * the MEAN scale, and the int64 accumulator of reproducible mode lives in
 * repro.h). Pure functions on caller memory; no allocation, no state.
 *
 * Every kernel is commutative bit for bit, so an algorithm in which two cores
 * each compute a op b and b op a (recursive doubling) still ends with identical
 * bits on both: a NaN result is always the canonical quiet NaN (0x7fc00000),
 * MAX(+0, -0) = +0 and MIN(+0, -0) = -0 whatever the order. NaN propagates
 * through all three ops. */
#ifndef TPUEMU_WORKER_COLL_REDUCE_H
#define TPUEMU_WORKER_COLL_REDUCE_H

#include <stddef.h>
#include <stdint.h>

enum reduce_op { REDUCE_OP_SUM = 0, REDUCE_OP_MAX = 1, REDUCE_OP_MIN = 2 };

#define REDUCE_CANON_NAN_BITS 0x7fc00000u

/* dst[i] = dst[i] op src[i] for i < n; dst and src must not overlap. */
void reduce_f32_sum(float *dst, const float *src, size_t n);
void reduce_f32_max(float *dst, const float *src, size_t n);
void reduce_f32_min(float *dst, const float *src, size_t n);
void reduce_f32(enum reduce_op op, float *dst, const float *src, size_t n);

/* x[i] /= d (MEAN: the sum divided by the number of terms, once, at the end). */
void reduce_f32_div(float *x, size_t n, float d);

#endif
