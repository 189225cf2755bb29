/* Array conversions between float32 and bfloat16. Written as plain loops the
 * compiler vectorizes; see bf16.h for the rounding rules. */
#include "bf16.h"

void bf16_from_f32_n(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16_from_f32(src[i]);
}

void bf16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16_to_f32(src[i]);
}
