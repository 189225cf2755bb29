/* Unit tests of the collectives' float32 kernels (server/worker/coll/reduce.c):
 * exact against float64 references (a single IEEE operation is exactly the
 * rounded float64 result), NaN propagation, signed zeros, and bit-for-bit
 * commutativity, which recursive doubling relies on. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "reduce.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* a reproducible spread of values: normals of many exponents, both signs */
static float rnd(uint64_t *st)
{
    *st = *st * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t u = (uint32_t)(*st >> 33);
    return ldexpf((float)(u & 0xffffff) / 16777216.0f - 0.5f, (int)((u >> 24) % 40) - 20);
}

#define N 1027 /* not a multiple of any vector width */

Test(reduce, sum_is_the_rounded_f64_sum)
{
    float a[N], b[N];
    uint64_t st = 1;
    for (int i = 0; i < N; i++)
        a[i] = rnd(&st), b[i] = rnd(&st);
    float ref[N];
    for (int i = 0; i < N; i++)
        ref[i] = (float)((double)a[i] + (double)b[i]);
    reduce_f32_sum(a, b, N);
    for (int i = 0; i < N; i++)
        cr_assert_eq(bits(a[i]), bits(ref[i]), "element %d", i);
}

Test(reduce, max_min_exact)
{
    float a[N], b[N], mx[N], mn[N];
    uint64_t st = 7;
    for (int i = 0; i < N; i++) {
        a[i] = rnd(&st), b[i] = rnd(&st);
        mx[i] = (float)fmax((double)a[i], (double)b[i]);
        mn[i] = (float)fmin((double)a[i], (double)b[i]);
    }
    float c[N];
    memcpy(c, a, sizeof c);
    reduce_f32_max(a, b, N);
    reduce_f32_min(c, b, N);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(bits(a[i]), bits(mx[i]), "max %d", i);
        cr_assert_eq(bits(c[i]), bits(mn[i]), "min %d", i);
    }
}

Test(reduce, nan_propagates_canonically_and_commutes)
{
    float x[6] = {NAN, 1.0f, from_bits(0xffc12345u), INFINITY, -INFINITY, 0.0f};
    float y[6] = {2.0f, from_bits(0x7fa00001u), from_bits(0x7fc00042u), -INFINITY, INFINITY, NAN};
    for (int op = 0; op < 3; op++) {
        float a[6], b[6];
        memcpy(a, x, sizeof a);
        memcpy(b, y, sizeof b);
        reduce_f32((enum reduce_op)op, a, y, 6);
        reduce_f32((enum reduce_op)op, b, x, 6);
        for (int i = 0; i < 6; i++)
            cr_assert_eq(bits(a[i]), bits(b[i]), "op %d element %d: %08x vs %08x", op, i, bits(a[i]),
                         bits(b[i]));
        for (int i = 0; i < 3; i++)
            cr_assert_eq(bits(a[i]), REDUCE_CANON_NAN_BITS, "op %d element %d", op, i);
        cr_assert_eq(bits(a[5]), REDUCE_CANON_NAN_BITS);
    }
    float s[1] = {INFINITY}, t[1] = {-INFINITY};
    reduce_f32_sum(s, t, 1);
    cr_assert_eq(bits(s[0]), REDUCE_CANON_NAN_BITS, "Inf + -Inf is the canonical NaN");
}

Test(reduce, signed_zeros_are_order_independent)
{
    float p = 0.0f, m = -0.0f;
    float a[4] = {p, m, p, m}, b[4] = {m, p, p, m};
    float c[4], d[4];
    memcpy(c, a, sizeof c);
    reduce_f32_max(c, b, 4);
    memcpy(d, b, sizeof d);
    reduce_f32_max(d, a, 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(bits(c[i]), bits(d[i]));
    cr_assert_eq(bits(c[0]), 0u, "max(+0,-0) = +0");
    cr_assert_eq(bits(c[3]), 0x80000000u, "max(-0,-0) = -0");
    memcpy(c, a, sizeof c);
    reduce_f32_min(c, b, 4);
    memcpy(d, b, sizeof d);
    reduce_f32_min(d, a, 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(bits(c[i]), bits(d[i]));
    cr_assert_eq(bits(c[0]), 0x80000000u, "min(+0,-0) = -0");
    cr_assert_eq(bits(c[2]), 0u, "min(+0,+0) = +0");
}

Test(reduce, mean_divides_once)
{
    float x[N];
    uint64_t st = 3;
    for (int i = 0; i < N; i++)
        x[i] = rnd(&st);
    float ref[N];
    for (int i = 0; i < N; i++)
        ref[i] = (float)((double)x[i] / 3.0);
    reduce_f32_div(x, N, 3.0f);
    for (int i = 0; i < N; i++)
        cr_assert_eq(bits(x[i]), bits(ref[i]));
}
