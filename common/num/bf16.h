/* bfloat16: the top 16 bits of an IEEE float32, the TPU's matmul input type.
 *
 * float32 -> bfloat16 rounds to nearest, ties to even, as XLA's bfloat16 type
 * does (Eigen's float_to_bfloat16_rtne):
 *   - NaN stays NaN: sign and the top payload bits are kept and the quiet bit is
 *     set (0x7f800001 -> 0x7fc0), so a signalling NaN never becomes infinity.
 *   - +-inf stay +-inf; finite values that round past the largest bfloat16
 *     (3.3895e38) become +-inf, as round-to-nearest requires.
 *   - Subnormal float32 inputs are rounded like any other value: bfloat16 has
 *     float32's exponent range, so they become bfloat16 subnormals (or +-0 when
 *     they round down to zero). They are NOT flushed to zero, although the TPU's
 *     own MXU flushes subnormals and Intel's vcvtne2ps2bf16 treats subnormal
 *     inputs as zero; the vector path below repairs those lanes so the scalar
 *     and array conversions agree bit for bit on all 2^32 inputs
 *     (tests/unit/test_bf16.c checks every one).
 * bfloat16 -> float32 is exact (a shift).
 *
 * Everything here is pure and thread-safe. */
#ifndef TPUEMU_COMMON_BF16_H
#define TPUEMU_COMMON_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t bf16_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and payload top, force quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);     /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

static inline float bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Whole arrays, bit-identical to the scalar functions above. On CPUs with
 * AVX512-BF16 (checked at run time) float32 -> bfloat16 uses vcvtne2ps2bf16,
 * 32 values per instruction; with AVX-512 alone the integer rounding, 16 lanes
 * at a time; elsewhere a portable loop. dst and src must not overlap. */
void bf16_from_f32_n(uint16_t *dst, const float *src, size_t n);
void bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);
/* dst[i] = bf16_to_f32(bf16_from_f32(src[i])) in one pass: float32 values
 * rounded to the bfloat16 they become (the matrix unit's widened inputs).
 * dst may be src. */
void bf16_round_n(float *dst, const float *src, size_t n);

/* The portable loops, always available (the tests compare both paths). */
void bf16_from_f32_n_portable(uint16_t *dst, const float *src, size_t n);
void bf16_to_f32_n_portable(float *dst, const uint16_t *src, size_t n);
void bf16_round_n_portable(float *dst, const float *src, size_t n);

/* "avx512bf16", "avx512" or "portable": the path bf16_from_f32_n takes on this CPU. */
const char *bf16_path(void);

#endif
