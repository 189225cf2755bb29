/* Unit tests of common/num/bf16: float32 -> bfloat16 as XLA rounds it, checked on
 * every one of the 2^32 float32 bit patterns against an independent reference,
 * for the scalar conversion and for the vectorized array conversion. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "bf16.h"

/* The reference, written from the definition rather than the add-and-shift
 * trick the code uses: keep the top half, then look at the dropped half. */
static uint16_t reference(uint32_t u)
{
    uint32_t hi = u >> 16, rest = u & 0xffffu;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(hi | 0x40u);   /* NaN: quiet, sign and payload top kept */
    if (rest > 0x8000u || (rest == 0x8000u && (hi & 1u)))
        hi++;                            /* above half, or a tie on an odd value */
    return (uint16_t)hi;
}

static uint16_t from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return bf16_from_f32(f);
}

#define CHUNK (1u << 16)
#define THREADS 2

struct sweep {
    uint64_t first, end;         /* bit patterns [first, end) */
    uint64_t bad_scalar, bad_array, bad_round;
    uint32_t first_bad;
};

static void *sweep_range(void *arg)
{
    struct sweep *s = arg;
    float *src = malloc(CHUNK * sizeof *src);
    uint16_t *dst = malloc(CHUNK * sizeof *dst);
    uint32_t *bits = malloc(CHUNK * sizeof *bits), *rounded = malloc(CHUNK * sizeof *rounded);
    if (!src || !dst || !bits || !rounded)
        abort();
    for (uint64_t base = s->first; base < s->end; base += CHUNK) {
        for (uint32_t i = 0; i < CHUNK; i++)
            bits[i] = (uint32_t)base + i;
        memcpy(src, bits, CHUNK * sizeof *src);
        bf16_from_f32_n(dst, src, CHUNK);
        bf16_round_n((float *)(void *)rounded, src, CHUNK);
        for (uint32_t i = 0; i < CHUNK; i++) {
            uint16_t want = reference(bits[i]);
            uint16_t scalar = bf16_from_f32(src[i]);
            int round_ok = rounded[i] == (uint32_t)want << 16;
            if (scalar != want || dst[i] != want || !round_ok) {
                if (!s->bad_scalar && !s->bad_array && !s->bad_round)
                    s->first_bad = bits[i];
                s->bad_scalar += scalar != want;
                s->bad_array += dst[i] != want;
                s->bad_round += !round_ok;
            }
        }
    }
    free(rounded);
    free(src);
    free(dst);
    free(bits);
    return NULL;
}

Test(bf16, every_float32_rounds_like_the_reference, .timeout = 540)
{
    pthread_t t[THREADS];
    struct sweep s[THREADS];
    const uint64_t total = 1ull << 32, per = total / THREADS;

    for (int i = 0; i < THREADS; i++) {
        s[i] = (struct sweep){.first = per * (uint64_t)i, .end = per * (uint64_t)(i + 1)};
        cr_assert_eq(pthread_create(&t[i], NULL, sweep_range, &s[i]), 0);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < THREADS; i++) {
        uint32_t u = s[i].first_bad;
        cr_assert(s[i].bad_scalar == 0 && s[i].bad_array == 0 && s[i].bad_round == 0,
                  "%llu scalar, %llu array and %llu rounding (%s path) conversions differ from the reference; "
                  "first 0x%08x -> scalar 0x%04x, reference 0x%04x",
                  (unsigned long long)s[i].bad_scalar, (unsigned long long)s[i].bad_array,
                  (unsigned long long)s[i].bad_round, bf16_path(), u, from_bits(u), reference(u));
    }
}

Test(bf16, ties_round_to_even)
{
    cr_assert_eq(from_bits(0x3f800000u), 0x3f80, "1.0 is exact");
    cr_assert_eq(from_bits(0x3f808000u), 0x3f80, "1 + 2^-8 is a tie: stays on the even 1.0");
    cr_assert_eq(from_bits(0x3f818000u), 0x3f82, "1 + 3*2^-8 is a tie: goes up to the even");
    cr_assert_eq(from_bits(0x3f808001u), 0x3f81, "just above the tie rounds up");
    cr_assert_eq(bf16_to_f32(bf16_from_f32(3.14159265f)), 3.140625f, "pi keeps 8 significant bits");
}

Test(bf16, nan_and_infinity_survive)
{
    cr_assert_eq(bf16_from_f32(INFINITY), 0x7f80);
    cr_assert_eq(bf16_from_f32(-INFINITY), 0xff80);
    cr_assert(isnan(bf16_to_f32(bf16_from_f32(NAN))));
    cr_assert_eq(from_bits(0x7f800001u), 0x7fc0, "a signalling NaN becomes a quiet NaN, not inf");
    cr_assert_eq(from_bits(0xffc00000u), 0xffc0, "the sign of a NaN is kept");
    cr_assert_eq(from_bits(0x7f7fffffu), 0x7f80, "FLT_MAX rounds up to infinity");
    cr_assert_eq(from_bits(0x7f7f7fffu), 0x7f7f, "the largest bf16 stays finite");
}

Test(bf16, subnormals_are_rounded_not_flushed)
{
    /* A user mixing in tiny gradients: XLA's bfloat16 keeps them. */
    cr_assert_eq(from_bits(0x00010000u), 0x0001, "smallest bf16 subnormal is exact");
    cr_assert_eq(from_bits(0x00000001u), 0x0000, "smallest f32 subnormal rounds to zero");
    cr_assert_eq(from_bits(0x80000001u), 0x8000, "... keeping its sign");
    cr_assert_eq(from_bits(0x00018000u), 0x0002, "a subnormal tie goes to the even");
    cr_assert_eq(from_bits(0x007fffffu), 0x0080, "largest subnormal rounds up to the smallest normal");

    float src[40];
    uint16_t dst[40];
    for (int i = 0; i < 40; i++) {
        uint32_t u = 0x00018000u + (uint32_t)i * 0x10000u;
        memcpy(&src[i], &u, sizeof u);
    }
    bf16_from_f32_n(dst, src, 40);
    for (int i = 0; i < 40; i++)
        cr_assert_eq(dst[i], bf16_from_f32(src[i]), "array path (%s) element %d", bf16_path(), i);
}

Test(bf16, widening_is_exact_for_every_bfloat16)
{
    static uint16_t all[65536];
    static float wide[65536], portable[65536];
    for (uint32_t i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    bf16_to_f32_n(wide, all, 65536);
    bf16_to_f32_n_portable(portable, all, 65536);
    cr_assert_eq(memcmp(wide, portable, sizeof wide), 0);
    for (uint32_t i = 0; i < 65536; i++) {
        uint32_t u;
        memcpy(&u, &wide[i], sizeof u);
        cr_assert_eq(u, i << 16, "bf16 0x%04x widens to 0x%08x", i, u);
        if (!isnan(wide[i]))
            cr_assert_eq(bf16_from_f32(wide[i]), i, "0x%04x survives the round trip", i);
    }
}

Test(bf16, odd_lengths_use_the_tail)
{
    float src[45];
    uint16_t dst[45], want[45];
    for (int i = 0; i < 45; i++)
        src[i] = 1.0f + (float)i / 3.0f;
    for (size_t n = 0; n <= 45; n++) {
        memset(dst, 0xab, sizeof dst);
        bf16_from_f32_n(dst, src, n);
        bf16_from_f32_n_portable(want, src, n);
        cr_assert_eq(memcmp(dst, want, n * sizeof *dst), 0, "n=%zu", n);
        if (n < 45)
            cr_assert_eq(dst[n], 0xabab, "n=%zu writes past the end", n);
        float r[46], rwant[45];
        memset(r, 0xab, sizeof r);
        bf16_round_n(r, src, n);
        bf16_round_n_portable(rwant, src, n);
        cr_assert_eq(memcmp(r, rwant, n * sizeof *r), 0, "rounding, n=%zu", n);
        uint32_t past;
        memcpy(&past, &r[n], sizeof past);
        cr_assert_eq(past, 0xababababu, "rounding, n=%zu writes past the end", n);
    }
}
