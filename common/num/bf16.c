/* Array conversions between float32 and bfloat16, with a run-time choice
 * between AVX-512 paths and portable loops. See bf16.h for the rounding rules;
 * every path must give the scalar functions' bits exactly. */
#include "bf16.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BF16_X86 1
#include <immintrin.h>
#endif

void bf16_from_f32_n_portable(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16_from_f32(src[i]);
}

void bf16_to_f32_n_portable(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16_to_f32(src[i]);
}

void bf16_round_n_portable(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16_to_f32(bf16_from_f32(src[i]));
}

#ifdef BF16_X86
#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define AVX512 __attribute__((target("avx512f,avx512bw")))

/* vcvtne2ps2bf16 rounds like bf16_from_f32 (nearest even, NaN quieted with
 * its sign and payload top kept) except that it reads subnormal inputs as zero.
 * Lanes holding a subnormal are redone with the integer rounding. */
AVX512BF16 static __m256i round_subnormals(__m512i u, __mmask16 sub, __m256i conv)
{
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    __m256i fixed = _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
    return _mm256_mask_blend_epi16(sub, conv, fixed);
}

AVX512BF16 static __mmask16 subnormal_lanes(__m512i u)
{
    const __m512i exp = _mm512_and_si512(u, _mm512_set1_epi32(0x7f800000));
    const __m512i man = _mm512_and_si512(u, _mm512_set1_epi32(0x007fffff));
    return _mm512_cmpeq_epi32_mask(exp, _mm512_setzero_si512()) &
           _mm512_cmpneq_epi32_mask(man, _mm512_setzero_si512());
}

AVX512BF16 static void from_f32_avx512bf16(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 lo = _mm512_loadu_ps(src + i), hi = _mm512_loadu_ps(src + i + 16);
        __m512i r = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
        __m512i ulo = _mm512_castps_si512(lo), uhi = _mm512_castps_si512(hi);
        __mmask16 slo = subnormal_lanes(ulo), shi = subnormal_lanes(uhi);
        if (__builtin_expect((slo | shi) != 0, 0)) {
            __m256i a = round_subnormals(ulo, slo, _mm512_castsi512_si256(r));
            __m256i b = round_subnormals(uhi, shi, _mm512_extracti64x4_epi64(r, 1));
            r = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
        }
        _mm512_storeu_si512((void *)(dst + i), r);
    }
    for (; i < n; i++)
        dst[i] = bf16_from_f32(src[i]);
}

AVX512 static void to_f32_avx512(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(src + i));
        __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16);
        _mm512_storeu_si512((void *)(dst + i), u);
    }
    for (; i < n; i++)
        dst[i] = bf16_to_f32(src[i]);
}

/* Without AVX512-BF16: bf16_from_f32's integer rounding, 16 lanes at a time.
 * Returns the rounded bits in the top half of each lane, NaN quieted. */
AVX512 static __m512i round_lanes(__m512i u)
{
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x00400000)));
}

AVX512 static void from_f32_avx512(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i r = round_lanes(_mm512_loadu_si512((const void *)(src + i)));
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    bf16_from_f32_n_portable(dst + i, src + i, n - i);
}

AVX512 static void round_avx512(float *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i r = round_lanes(_mm512_loadu_si512((const void *)(src + i)));
        _mm512_storeu_si512((void *)(dst + i), _mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
    }
    bf16_round_n_portable(dst + i, src + i, n - i);
}

static int have_avx512(void)
{
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}

static int have_avx512bf16(void)
{
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}
#endif

void bf16_from_f32_n(uint16_t *dst, const float *src, size_t n)
{
#ifdef BF16_X86
    if (have_avx512bf16()) {
        from_f32_avx512bf16(dst, src, n);
        return;
    }
    if (have_avx512()) {
        from_f32_avx512(dst, src, n);
        return;
    }
#endif
    bf16_from_f32_n_portable(dst, src, n);
}

void bf16_round_n(float *dst, const float *src, size_t n)
{
#ifdef BF16_X86
    if (have_avx512()) {
        round_avx512(dst, src, n);
        return;
    }
#endif
    bf16_round_n_portable(dst, src, n);
}

void bf16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
#ifdef BF16_X86
    if (have_avx512()) {
        to_f32_avx512(dst, src, n);
        return;
    }
#endif
    bf16_to_f32_n_portable(dst, src, n);
}

const char *bf16_path(void)
{
#ifdef BF16_X86
    if (have_avx512bf16())
        return "avx512bf16";
    if (have_avx512())
        return "avx512";
#endif
    return "portable";
}
