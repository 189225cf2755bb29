/* bfloat16: the top 16 bits of an IEEE float32. Conversion from float32 rounds
 * to nearest even as XLA does; NaN stays NaN (quieted) and infinities stay
 * infinite. Subnormal float32 inputs are rounded like any other value (bf16
 * has the same exponent range, so they map to bf16 subnormals or zero). */
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

/* Whole arrays; vectorized where the CPU allows. dst and src must not overlap. */
void bf16_from_f32_n(uint16_t *dst, const float *src, size_t n);
void bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);

#endif
