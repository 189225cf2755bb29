/* The reproducible-mode accumulator: block exponents, float -> int64 fixed
 * point, the associative int64 sum, and the single rounding back (repro.h). */
#include "repro.h"

#include <math.h>
#include <string.h>

#include "bf16.h"
#include "reduce.h"

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* |x| < 2^e for finite non-zero x (subnormals: -126, an upper bound); the
 * biased exponent field: 0 for zero/subnormal, 255 for Inf/NaN. */
static inline int exp_of_bits(uint32_t u, int *finite_nonzero)
{
    int be = (int)((u >> 23) & 0xffu);
    *finite_nonzero = be != 255 && (u & 0x7fffffffu) != 0;
    return be == 0 ? -126 : be - 126;
}

static void exponents_bits(float *exp, const void *x, size_t count, int bf16)
{
    size_t nb = repro_nblocks(count);
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * REPRO_BLOCK, hi = lo + REPRO_BLOCK < count ? lo + REPRO_BLOCK : count;
        int e = INT32_MIN, fnz;
        for (size_t i = lo; i < hi; i++) {
            uint32_t u = bf16 ? (uint32_t)((const uint16_t *)x)[i] << 16 : f32_bits(((const float *)x)[i]);
            int ei = exp_of_bits(u, &fnz);
            if (fnz && ei > e)
                e = ei;
        }
        exp[b] = e == INT32_MIN ? REPRO_EXP_EMPTY : (float)e;
    }
}

void repro_exponents(float *exp, const float *x, size_t count)
{
    exponents_bits(exp, x, count, 0);
}

void repro_exponents_bf16(float *exp, const uint16_t *x, size_t count)
{
    exponents_bits(exp, x, count, 1);
}

static inline int64_t fix_one(float x, double scale)
{
    if (isnan(x))
        return REPRO_NAN;
    if (isinf(x))
        return x > 0 ? REPRO_PINF : REPRO_NINF;
    return (int64_t)llrint((double)x * scale); /* exact product; rounds to nearest even */
}

/* Runs fn over [first, first+n) one exponent block at a time. */
#define FOR_BLOCKS(first, n, exp, body)                                                    \
    do {                                                                                   \
        size_t i_ = 0;                                                                     \
        while (i_ < (n)) {                                                                 \
            size_t g_ = (first) + i_, b_ = g_ / REPRO_BLOCK;                               \
            size_t m_ = (b_ + 1) * REPRO_BLOCK - g_;                                       \
            if (m_ > (n) - i_)                                                             \
                m_ = (n) - i_;                                                             \
            float e_ = (exp)[b_];                                                          \
            body;                                                                          \
            i_ += m_;                                                                      \
        }                                                                                  \
    } while (0)

void repro_to_fixed(int64_t *q, const float *x, size_t first, size_t n, const float *exp)
{
    FOR_BLOCKS(first, n, exp, {
        double scale = e_ == REPRO_EXP_EMPTY ? 0.0 : ldexp(1.0, REPRO_FRAC - (int)e_);
        for (size_t j = i_; j < i_ + m_; j++)
            q[j] = fix_one(x[j], scale);
    });
}

void repro_to_fixed_bf16(int64_t *q, const uint16_t *x, size_t first, size_t n, const float *exp)
{
    FOR_BLOCKS(first, n, exp, {
        double scale = e_ == REPRO_EXP_EMPTY ? 0.0 : ldexp(1.0, REPRO_FRAC - (int)e_);
        for (size_t j = i_; j < i_ + m_; j++)
            q[j] = fix_one(bf16_to_f32(x[j]), scale);
    });
}

void repro_sum_i64(int64_t *restrict dst, const int64_t *restrict src, size_t n)
{
    const int64_t lim = INT64_MIN + 3; /* below: a non-finite encoding */
    for (size_t i = 0; i < n; i++) {
        int64_t a = dst[i], b = src[i];
        int64_t s = (int64_t)((uint64_t)a + (uint64_t)b);
        int64_t sp = a == b ? a : (b >= lim ? a : (a >= lim ? b : REPRO_NAN));
        dst[i] = (a < lim || b < lim) ? sp : s;
    }
}

float repro_round(int64_t q, int e, int bits)
{
    uint64_t a = q < 0 ? (uint64_t)0 - (uint64_t)q : (uint64_t)q;
    int msb, k, unit = e - REPRO_FRAC; /* value = a x 2^unit */
    double v;

    if (a == 0)
        return q < 0 ? -0.0f : 0.0f;
    msb = 63 - __builtin_clzll(a);
    /* keep `bits` significant bits, but nothing below the smallest subnormal
     * of the float32 exponent range (2^(-126 - (bits - 1))) */
    k = msb - (bits - 1);
    if (-126 - (bits - 1) - unit > k)
        k = -126 - (bits - 1) - unit;
    if (k > 0) {
        if (k >= 63) { /* |a| < 2^62 <= half: rounds to zero */
            a = 0;
        } else {
            uint64_t half = (uint64_t)1 << (k - 1), rem = a & (((uint64_t)1 << k) - 1);
            a >>= k;
            if (rem > half || (rem == half && (a & 1)))
                a++;
        }
        unit += k;
    }
    v = ldexp((double)a, unit); /* exact: a has at most bits+1 significant bits */
    return (float)(q < 0 ? -v : v); /* exact, or overflow to Inf */
}

static inline float unfix_special(int64_t q)
{
    if (q == REPRO_PINF)
        return INFINITY;
    if (q == REPRO_NINF)
        return -INFINITY;
    uint32_t u = REDUCE_CANON_NAN_BITS;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void repro_from_fixed(float *out, const int64_t *q, size_t first, size_t n, const float *exp,
                      float divisor)
{
    FOR_BLOCKS(first, n, exp, {
        int e = e_ == REPRO_EXP_EMPTY ? 0 : (int)e_;
        for (size_t j = i_; j < i_ + m_; j++) {
            float f = q[j] < INT64_MIN + 3 ? unfix_special(q[j]) : repro_round(q[j], e, 24);
            out[j] = divisor > 1.0f ? f / divisor : f;
        }
    });
}

void repro_from_fixed_bf16(uint16_t *out, const int64_t *q, size_t first, size_t n,
                           const float *exp, float divisor)
{
    FOR_BLOCKS(first, n, exp, {
        int e = e_ == REPRO_EXP_EMPTY ? 0 : (int)e_;
        for (size_t j = i_; j < i_ + m_; j++) {
            float f;
            if (q[j] < INT64_MIN + 3)
                f = unfix_special(q[j]);
            else if (divisor > 1.0f)
                f = repro_round(q[j], e, 24) / divisor; /* MEAN: rounded again below */
            else
                f = repro_round(q[j], e, 8); /* exact in bf16: one rounding in all */
            out[j] = bf16_from_f32(f);
        }
    });
}
