/* Unit tests of reproducible mode's accumulator (server/worker/coll/repro.c):
 * the sum of n replicas' vectors must be bitwise the same for every order and
 * grouping of the terms (the algorithms, chunkings and core counts only change
 * those), and equal the float64 reference rounded once wherever the float64
 * sum is itself exact (values within 2^28 of each other: float64 holds their
 * sum of up to 64 terms exactly), and within 2^-52 of the largest magnitude
 * otherwise. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "repro.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static uint64_t st = 12345;
static float rnd(int spread)
{
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t u = (uint32_t)(st >> 33);
    return ldexpf((float)(u & 0xffffff) / 16777216.0f - 0.5f, (int)((u >> 24) % (unsigned)spread));
}

#define N 700 /* three exponent blocks, the last partial */
#define R 13  /* replicas */

/* the whole pipeline for terms x[r][i] in a given order of replicas and a
 * given tree shape: max exponents, fixed point, integer sums, back */
static void repro_sum(float x[R][N], const int *order, int pairwise, float *out)
{
    size_t nb = repro_nblocks(N);
    float exp[R][(N + REPRO_BLOCK - 1) / REPRO_BLOCK], emax[(N + REPRO_BLOCK - 1) / REPRO_BLOCK];
    static int64_t q[R][N];
    for (int r = 0; r < R; r++)
        repro_exponents(exp[r], x[r], N);
    for (size_t b = 0; b < nb; b++) {
        emax[b] = exp[order[0]][b];
        for (int r = 1; r < R; r++)
            if (exp[order[r]][b] > emax[b])
                emax[b] = exp[order[r]][b];
    }
    for (int r = 0; r < R; r++)
        repro_to_fixed(q[r], x[r], 0, N, emax);
    if (pairwise) { /* a tree, as recursive halving would do */
        for (int step = 1; step < R; step *= 2)
            for (int r = 0; r + step < R; r += 2 * step)
                repro_sum_i64(q[order[r]], q[order[r + step]], N);
    } else {
        for (int r = 1; r < R; r++)
            repro_sum_i64(q[order[0]], q[order[r]], N);
    }
    /* chunked conversion back: any split gives the same bits */
    repro_from_fixed(out, q[order[0]], 0, 300, emax, 1.0f);
    repro_from_fixed(out + 300, q[order[0]] + 300, 300, N - 300, emax, 1.0f);
}

Test(repro, order_and_tree_independent)
{
    static float x[R][N];
    float a[N], b[N], c[N];
    int fwd[R], rev[R], shuf[R];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < N; i++)
            x[r][i] = rnd(60);
    for (int r = 0; r < R; r++)
        fwd[r] = r, rev[r] = R - 1 - r, shuf[r] = (r * 5) % R;
    repro_sum(x, fwd, 0, a);
    repro_sum(x, rev, 1, b);
    repro_sum(x, shuf, 1, c);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(bits(a[i]), bits(b[i]), "element %d", i);
        cr_assert_eq(bits(a[i]), bits(c[i]), "element %d", i);
    }
}

Test(repro, exact_when_f64_is_exact)
{
    static float x[R][N];
    float out[N];
    int fwd[R];
    for (int r = 0; r < R; r++) {
        fwd[r] = r;
        for (int i = 0; i < N; i++)
            x[r][i] = rnd(20); /* exponents within 2^20: every term converts exactly */
    }
    repro_sum(x, fwd, 1, out);
    for (int i = 0; i < N; i++) {
        double ref = 0;
        for (int r = 0; r < R; r++)
            ref += x[r][i]; /* exact in float64: 13 terms within 2^44 */
        cr_assert_eq(bits(out[i]), bits((float)ref), "element %d: %a vs %a", i, (double)out[i], ref);
    }
}

Test(repro, wide_range_within_bound)
{
    static float x[R][N];
    float out[N];
    int fwd[R];
    for (int r = 0; r < R; r++) {
        fwd[r] = r;
        for (int i = 0; i < N; i++)
            x[r][i] = rnd(100);
    }
    repro_sum(x, fwd, 0, out);
    for (int i = 0; i < N; i++) {
        long double ref = 0, mx = 0;
        for (int r = 0; r < R; r++) {
            ref += x[r][i];
            if (fabsl((long double)x[r][i]) > mx)
                mx = fabsl((long double)x[r][i]);
        }
        /* one float rounding of the result + R terms each off by <= 2^-52 x block max */
        long double tol = fabsl(ref) * 0x1p-24L + R * 0x1p-51L * 0x1p100L;
        cr_assert(fabsl((long double)out[i] - ref) <= tol, "element %d", i);
        (void)mx;
    }
}

Test(repro, non_finite)
{
    int64_t a[4], b[4];
    float e[1] = {1.0f}, out[4];
    float x[4] = {INFINITY, INFINITY, NAN, 1.0f}, y[4] = {1.0f, -INFINITY, 2.0f, -INFINITY};
    repro_to_fixed(a, x, 0, 4, e);
    repro_to_fixed(b, y, 0, 4, e);
    int64_t c[4];
    memcpy(c, b, sizeof c);
    repro_sum_i64(a, b, 4);
    repro_sum_i64(c, (int64_t[4]){0}, 4); /* identity */
    repro_from_fixed(out, a, 0, 4, e, 1.0f);
    cr_assert(isinf(out[0]) && out[0] > 0);
    cr_assert(isnan(out[1]));
    cr_assert(isnan(out[2]));
    cr_assert(isinf(out[3]) && out[3] < 0);
}

Test(repro, rounding_to_bf16_once)
{
    /* 1 + 2^-8 + 2^-20: bf16 rounding of the exact sum goes up; rounding to
     * float32 first would give 1 + 2^-8 exactly (a tie) and then down to 1 */
    float x[3] = {1.0f, 0x1p-8f, 0x1p-20f};
    float e[1];
    int64_t q[3];
    repro_exponents(e, (float[1]){1.0f}, 1);
    repro_to_fixed(q, x, 0, 3, (float[1]){e[0]});
    int64_t s[1] = {q[0]};
    repro_sum_i64(s, &q[1], 1);
    repro_sum_i64(s, &q[2], 1);
    uint16_t out[1];
    repro_from_fixed_bf16(out, s, 0, 1, e, 1.0f);
    cr_assert_eq(out[0], bf16_from_f32(1.0f + 0x1p-7f), "got %04x", out[0]);
}

Test(repro, subnormal_results_round_once)
{
    /* a result in float32's subnormal range is rounded at 2^-149 directly */
    cr_assert_eq(bits(repro_round(3, REPRO_FRAC - 150, 24)), 2u);
    cr_assert_eq(bits(repro_round(-5, 0, 24)), bits(-0x5p-52f));
    cr_assert_eq(bits(repro_round(0, 0, 24)), 0u);
}
