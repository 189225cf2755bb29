/* repro: the accumulator of reproducible mode. A sum whose bits do not depend
 * on the order of its terms (so not on the algorithm, the chunking or the
 * number of cores) because it is an integer sum:
 *
 * 1. every core computes, per block of REPRO_BLOCK elements (by global element
 *    index), the largest binary exponent E of its finite values (|x| < 2^E);
 *    the cores all-reduce these with MAX (a tiny collective, 1/REPRO_BLOCK of
 *    the data);
 * 2. each value becomes the int64 round(x * 2^(REPRO_FRAC - E)) (round to
 *    nearest even): |q| < 2^52, so up to 2^REPRO_HEADROOM = 1024 terms cannot
 *    overflow; the int64 vectors are all-reduced with repro_sum_i64, which is
 *    associative and commutative (plain integer addition, plus an absorbing
 *    encoding of Inf/NaN);
 * 3. the integer sum is converted back with ONE rounding (to float32 or
 *    directly to bfloat16, subnormals included).
 *
 * Precision: a term is rounded to a multiple of 2^(E-52): values within
 * 2^-28 of the block's largest magnitude are converted exactly; smaller ones
 * lose their bits below 2^-53 x 2^E, deterministically. That is far below the
 * float32 rounding of the result (2^-24 relative). Inf and NaN: +Inf and -Inf
 * give NaN, any NaN gives the canonical NaN, otherwise the infinity. */
#ifndef TPUEMU_WORKER_COLL_REPRO_H
#define TPUEMU_WORKER_COLL_REPRO_H

#include <stddef.h>
#include <stdint.h>

#define REPRO_BLOCK 256
#define REPRO_HEADROOM 10
#define REPRO_FRAC (62 - REPRO_HEADROOM)
#define REPRO_MAX_TERMS (1 << REPRO_HEADROOM)
/* The exponent of a block without a finite non-zero value. */
#define REPRO_EXP_EMPTY (-1000.0f)

/* Encodings of non-finite sums (finite ones lie in (-2^62, 2^62)). */
#define REPRO_NAN INT64_MIN
#define REPRO_PINF (INT64_MIN + 1)
#define REPRO_NINF (INT64_MIN + 2)

static inline size_t repro_nblocks(size_t count)
{
    return (count + REPRO_BLOCK - 1) / REPRO_BLOCK;
}

/* exp[b] = max exponent of block b of x[0..count) (block 0 starts at x[0]);
 * stored as floats so the MAX all-reduce is an ordinary float32 one. */
void repro_exponents(float *exp, const float *x, size_t count);
void repro_exponents_bf16(float *exp, const uint16_t *x, size_t count);

/* q[i] = fixed-point of x[i] for global elements [first, first + n); exp is
 * indexed by global block (first / REPRO_BLOCK ...). */
void repro_to_fixed(int64_t *q, const float *x, size_t first, size_t n, const float *exp);
void repro_to_fixed_bf16(int64_t *q, const uint16_t *x, size_t first, size_t n, const float *exp);

/* dst[i] = dst[i] + src[i], associative and commutative including the
 * non-finite encodings. */
void repro_sum_i64(int64_t *dst, const int64_t *src, size_t n);

/* Back to float32 / bfloat16 with one rounding each; divisor > 1 (MEAN) then
 * divides the float32 result (a second, deterministic rounding). */
void repro_from_fixed(float *out, const int64_t *q, size_t first, size_t n, const float *exp,
                      float divisor);
void repro_from_fixed_bf16(uint16_t *out, const int64_t *q, size_t first, size_t n,
                           const float *exp, float divisor);

/* One value: the rounding of q x 2^(e - REPRO_FRAC) to `bits` significant bits
 * with the float32 exponent range (24: float32, 8: bfloat16), as a float. */
float repro_round(int64_t q, int e, int bits);

#endif
