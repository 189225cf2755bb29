/* Unit tests of the matrix unit: results a user can check by hand (bf16
 * inputs, f32 accumulation, transposes, accumulate), precision modes, the
 * primitive cache and the MXU utilization figure. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <oneapi/dnnl/dnnl.h>

#include "bf16.h"
#include "mxu.h"

static mxu *u;

static void setup(void)
{
    err e;
    cr_assert_eq(mxu_new(&u, 128, &e), CODE_OK, "%s", e.msg);
}

static void teardown(void)
{
    mxu_free(u);
}

static void fill(float *x, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
}

/* C = op(A) . op(B) in double, from inputs optionally rounded to bf16 first. */
static void reference(const struct mxu_op *op, const float *a, const float *b, double *c, int round)
{
    for (int64_t i = 0; i < op->m; i++)
        for (int64_t j = 0; j < op->n; j++) {
            double s = 0;
            for (int64_t p = 0; p < op->k; p++) {
                float x = op->trans_a ? a[p * op->m + i] : a[i * op->k + p];
                float y = op->trans_b ? b[j * op->k + p] : b[p * op->n + j];
                if (round) {
                    x = bf16_to_f32(bf16_from_f32(x));
                    y = bf16_to_f32(bf16_from_f32(y));
                }
                s += (double)x * (double)y;
            }
            c[i * op->n + j] = s;
        }
}

static double max_err(const float *c, const double *ref, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)c[i] - ref[i]));
    return m;
}

TestSuite(mxu, .init = setup, .fini = teardown);

Test(mxu, small_product_by_hand)
{
    /* [1 2; 3 4] . [5 6; 7 8] = [19 22; 43 50], exact in bf16 */
    const float a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8};
    float c[4];
    struct mxu_op op = {2, 2, 2, 0, 0, 0, 0, 0};
    struct mxu_stats st;
    err e;
    cr_assert_eq(mxu_matmul(u, MXU_DEFAULT, &op, a, b, c, &st, &e), CODE_OK, "%s", e.msg);
    cr_assert(c[0] == 19 && c[1] == 22 && c[2] == 43 && c[3] == 50, "[%g %g; %g %g]", c[0], c[1], c[2], c[3]);
    cr_assert_float_eq(st.flops, 16.0, 0);
}

Test(mxu, default_rounds_inputs_to_bf16_and_accumulates_in_f32)
{
    /* 1 + 2^-10 is not a bf16: DEFAULT multiplies 1.0, HIGHEST the exact value */
    const float a[] = {1.0f + 0x1p-10f}, b[] = {1.0f};
    float c[1];
    struct mxu_op op = {1, 1, 1, 0, 0, 0, 0, 0};
    err e;
    cr_assert_eq(mxu_matmul(u, MXU_DEFAULT, &op, a, b, c, NULL, &e), CODE_OK);
    cr_assert_eq(c[0], 1.0f, "DEFAULT sees bf16(1 + 2^-10) = 1");
    cr_assert_eq(mxu_matmul(u, MXU_HIGHEST, &op, a, b, c, NULL, &e), CODE_OK);
    cr_assert_eq(c[0], 1.0f + 0x1p-10f, "HIGHEST keeps float32");

    /* the sum of 512 products of 1 + 1/256 stays exact in the f32 accumulator
     * (a bf16 accumulator would stall at 256) */
    enum { K = 512 };
    float ones[K], w[K];
    for (int i = 0; i < K; i++)
        ones[i] = 1.0f, w[i] = 1.0f + 1.0f / 128;
    struct mxu_op dot = {1, 1, K, 0, 0, 0, 0, 0};
    cr_assert_eq(mxu_matmul(u, MXU_DEFAULT, &dot, ones, w, c, NULL, &e), CODE_OK);
    cr_assert_float_eq(c[0], K * (1.0 + 1.0 / 128), 1e-3);
}

static void check_shape_on(mxu *v, int64_t m, int64_t n, int64_t k, int ta, int tb)
{
    struct mxu_op op = {m, n, k, ta, tb, 0, 0, 0};
    float *a = malloc((size_t)(m * k) * sizeof *a), *b = malloc((size_t)(k * n) * sizeof *b);
    float *c = malloc((size_t)(m * n) * sizeof *c);
    double *ref = malloc((size_t)(m * n) * sizeof *ref);
    err e;

    fill(a, (size_t)(m * k), 7);
    fill(b, (size_t)(k * n), 11);
    reference(&op, a, b, ref, 1);
    cr_assert_eq(mxu_matmul(v, MXU_DEFAULT, &op, a, b, c, NULL, &e), CODE_OK, "%s", e.msg);
    /* same bf16 products, f32 vs double accumulation: error ~ k * 2^-24 */
    double tol = 1e-5 * (double)k;
    cr_assert_leq(max_err(c, ref, (size_t)(m * n)), tol, "DEFAULT %lldx%lldx%lld ta=%d tb=%d", (long long)m,
                  (long long)n, (long long)k, ta, tb);
    reference(&op, a, b, ref, 0);
    cr_assert_eq(mxu_matmul(v, MXU_HIGHEST, &op, a, b, c, NULL, &e), CODE_OK, "%s", e.msg);
    cr_assert_leq(max_err(c, ref, (size_t)(m * n)), tol, "HIGHEST %lldx%lldx%lld ta=%d tb=%d", (long long)m,
                  (long long)n, (long long)k, ta, tb);
    free(a), free(b), free(c), free(ref);
}

static void check_shape(int64_t m, int64_t n, int64_t k, int ta, int tb)
{
    check_shape_on(u, m, n, k, ta, tb);
}

Test(mxu, layer_shapes_and_transposes_match_a_reference)
{
    check_shape(32, 128, 784, 0, 0);   /* forward x.W1 */
    check_shape(32, 10, 128, 0, 0);    /* forward h.W2 */
    check_shape(32, 128, 10, 0, 1);    /* backward dy.W2^T */
    check_shape(784, 128, 32, 1, 0);   /* backward x^T.dh */
    check_shape(7, 5, 3, 1, 1);
}

Test(mxu, accumulate_adds_into_c)
{
    const float a[] = {1, 2}, b[] = {3, 4};
    float c[1] = {100};
    struct mxu_op op = {1, 1, 2, 0, 0, 1, 0, 0};
    err e;
    cr_assert_eq(mxu_matmul(u, MXU_DEFAULT, &op, a, b, c, NULL, &e), CODE_OK);
    cr_assert_eq(c[0], 111, "100 + 1*3 + 2*4");
}

Test(mxu, bf16_entry_takes_raw_bits)
{
    uint16_t a[] = {bf16_from_f32(2.0f)}, b[] = {bf16_from_f32(-3.0f)};
    float c[1];
    struct mxu_op op = {1, 1, 1, 0, 0, 0, 0, 0};
    err e;
    cr_assert_eq(mxu_matmul_bf16(u, &op, a, b, c, NULL, &e), CODE_OK);
    cr_assert_eq(c[0], -6.0f);
}

Test(mxu, one_primitive_per_shape)
{
    float a[64] = {0}, b[64] = {0}, c[64];
    struct mxu_op op = {8, 8, 8, 0, 0, 0, 0, 0}, other = {4, 8, 8, 0, 0, 0, 0, 0};
    err e;
    for (int i = 0; i < 5; i++)
        cr_assert_eq(mxu_matmul(u, MXU_HIGHEST, &op, a, b, c, NULL, &e), CODE_OK);
    cr_assert_eq(mxu_primitives_created(u), 1, "five calls of one shape build one primitive");
    cr_assert_eq(mxu_matmul(u, MXU_HIGHEST, &other, a, b, c, NULL, &e), CODE_OK);
    cr_assert_eq(mxu_primitives_created(u), 2, "a new shape builds another");
    cr_assert_eq(mxu_matmul(u, MXU_DEFAULT, &op, a, b, c, NULL, &e), CODE_OK);
    /* a native bf16 kernel is a primitive of its own; widened inputs reuse the float32 one */
    unsigned want = mxu_bf16_native(u) ? 3 : 2;
    cr_assert_eq(mxu_primitives_created(u), want, "DEFAULT after HIGHEST (bf16 native: %d)", mxu_bf16_native(u));
    cr_assert_eq(mxu_primitives_cached(u), want);
}

/* Either bf16 kernel (oneDNN's bf16 matmul, or bf16 inputs widened for its
 * float32 one) computes the MXU's product: with inputs and sums chosen so that
 * every partial sum is exact, the bits of the portable unit's in-order sum. */
static void same_as_portable_unit(mxu *v)
{
    enum { M = 6, N = 7, K = 5 };
    float a[M * K], b[K * N], c[M * N], want[M * N];
    uint16_t ha[M * K], hb[K * N];
    struct mxu_op op = {M, N, K, 0, 0, 0, 0, 0};
    err e;
    for (int i = 0; i < M * K; i++)
        a[i] = 0.125f * (float)(i % 7) - 0.375f + 0x1p-12f; /* mostly not a bf16: DEFAULT rounds the 2^-12 off */
    for (int i = 0; i < K * N; i++)
        b[i] = 0.25f * (float)(i % 11) - 1.0f;
    cr_assert_eq(mxu_matmul_fixed(v, MXU_DEFAULT, &op, a, b, want, NULL, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(mxu_matmul(v, MXU_DEFAULT, &op, a, b, c, NULL, &e), CODE_OK, "%s", e.msg);
    cr_assert_arr_eq(c, want, sizeof c, "float32 entry, bf16 native %d", mxu_bf16_native(v));
    bf16_from_f32_n(ha, a, M * K);
    bf16_from_f32_n(hb, b, K * N);
    memset(c, 0, sizeof c);
    cr_assert_eq(mxu_matmul_bf16(v, &op, ha, hb, c, NULL, &e), CODE_OK, "%s", e.msg);
    cr_assert_arr_eq(c, want, sizeof c, "bf16 entry, bf16 native %d", mxu_bf16_native(v));
}

Test(mxu, default_kernel_is_the_portable_units_product)
{
    same_as_portable_unit(u);
}

/* A unit made with TPUEMU_MXU_BF16=kernel in the environment. */
static mxu *forced_unit(const char *kernel)
{
    mxu *v;
    err e;
    setenv("TPUEMU_MXU_BF16", kernel, 1);
    cr_assert_eq(mxu_new(&v, 128, &e), CODE_OK, "%s", e.msg);
    unsetenv("TPUEMU_MXU_BF16");
    return v;
}

/* TPUEMU_MXU_BF16=f32 widens on any CPU: the path of every CPU without a bf16
 * dot product, checked here on whichever CPU runs the tests. */
Test(mxu, widened_kernel_matches_a_reference)
{
    mxu *v = forced_unit("f32");
    cr_assert_eq(mxu_bf16_native(v), 0);
    same_as_portable_unit(v);
    check_shape_on(v, 128, 128, 784, 0, 0);
    check_shape_on(v, 784, 128, 128, 1, 0);
    check_shape_on(v, 7, 5, 3, 1, 1);
    mxu_free(v);
}

/* An operand marked exact (already rounded, as the model keeps a layer's
 * input and kernel for its backward matmuls) gives the bits of the unmarked
 * raw operand, on each kernel and for every transpose: the unit rounds only
 * what is not rounded yet, and the same rounded values give the same sums. */
static void exact_operands_same_bits(mxu *v, int fixed)
{
    enum { M = 48, N = 40, K = 72 };
    static float a[M * K], b[K * N], ar[M * K], br[K * N], want[M * N], c[M * N];
    unsigned s = 5;
    err e;
    for (int i = 0; i < M * K; i++)
        a[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f; /* 24 bits: rarely a bf16 */
    for (int i = 0; i < K * N; i++)
        b[i] = (float)((s = s * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f;
    bf16_round_n(ar, a, M * K);
    bf16_round_n(br, b, K * N);
    for (int t = 0; t < 4; t++)
        for (int x = 1; x < 4; x++) {
            struct mxu_op raw = {M, N, K, t & 1, t >> 1, 0, 0, 0}, op = raw;
            op.exact_a = x & 1, op.exact_b = x >> 1;
            int (*mm)(mxu *, mxu_precision, const struct mxu_op *, const float *, const float *, float *,
                      struct mxu_stats *, err *) = fixed ? mxu_matmul_fixed : mxu_matmul;
            cr_assert_eq(mm(v, MXU_DEFAULT, &raw, a, b, want, NULL, &e), CODE_OK, "%s", e.msg);
            cr_assert_eq(mm(v, MXU_DEFAULT, &op, op.exact_a ? ar : a, op.exact_b ? br : b, c, NULL, &e), CODE_OK,
                         "%s", e.msg);
            cr_assert_arr_eq(c, want, sizeof c, "transposes %d, exact a %d b %d, fixed %d, native %d", t,
                             op.exact_a, op.exact_b, fixed, mxu_bf16_native(v));
        }
    if (!fixed && mxu_bf16_native(v))
        return; /* a native bf16 kernel converts every operand: exact changes nothing there */
    /* and where the unit rounds in float32, exact is taken at its word: an
     * operand that is not rounded yet is multiplied as it is */
    struct mxu_op raw = {M, N, K, 0, 0, 0, 0, 0}, op = {M, N, K, 0, 0, 0, 1, 0};
    int (*mm)(mxu *, mxu_precision, const struct mxu_op *, const float *, const float *, float *,
              struct mxu_stats *, err *) = fixed ? mxu_matmul_fixed : mxu_matmul;
    cr_assert_eq(mm(v, MXU_DEFAULT, &raw, a, b, want, NULL, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(mm(v, MXU_DEFAULT, &op, a, b, c, NULL, &e), CODE_OK, "%s", e.msg);
    cr_assert(memcmp(c, want, sizeof c) != 0, "exact a was rounded anyway (fixed %d)", fixed);
}

Test(mxu, exact_operands_are_not_rounded_again)
{
    mxu *v = forced_unit("f32");
    exact_operands_same_bits(v, 0);
    exact_operands_same_bits(v, 1);
    mxu_free(v);
    exact_operands_same_bits(u, 0);
}

/* TPUEMU_MXU_BF16=onednn asks for oneDNN's bf16 matmul; where oneDNN has none
 * (below AVX-512; ONEDNN_MAX_CPU_ISA=AVX2 shows it on any CPU) the unit widens
 * instead of failing, and mxu_bf16_native then answers 0. */
Test(mxu, forced_onednn_bf16_runs_or_widens)
{
    mxu *v = forced_unit("onednn");
    same_as_portable_unit(v);
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    int has = (isa & (unsigned)dnnl_cpu_isa_avx512_core) == (unsigned)dnnl_cpu_isa_avx512_core;
    cr_assert_eq(mxu_bf16_native(v), has, "oneDNN ISA %#x: bf16 native %d", isa, mxu_bf16_native(v));
    mxu_free(v);
}

Test(mxu, many_shapes_are_evicted_not_leaked)
{
    float a[100] = {0}, b[100] = {0}, c[100];
    err e;
    for (int i = 1; i <= 100; i++) {
        struct mxu_op op = {1, 1, i, 0, 0, 0, 0, 0};
        cr_assert_eq(mxu_matmul(u, MXU_HIGHEST, &op, a, b, c, NULL, &e), CODE_OK);
    }
    cr_assert_eq(mxu_primitives_created(u), 100);
    cr_assert_leq(mxu_primitives_cached(u), 64);
}

Test(mxu, utilization_shows_padding_waste)
{
    struct mxu_stats st;
    float *a = calloc(32 * 784, sizeof *a), *b = calloc(784 * 100, sizeof *b), *c = calloc(32 * 100, sizeof *c);
    struct mxu_op op = {32, 100, 784, 0, 0, 0, 0, 0};
    err e;
    cr_assert_eq(mxu_matmul(u, MXU_DEFAULT, &op, a, b, c, &st, &e), CODE_OK);
    /* N = 100 pads to 128 and K = 784 to 896: 100/128 * 784/896 = 68.4% */
    cr_assert_float_eq(st.utilization, (100.0 / 128) * (784.0 / 896), 1e-12);
    cr_assert_float_eq(st.padded_flops, 2.0 * 32 * 128 * 896, 1e-3);
    cr_assert_float_eq(mxu_utilization(1024, 1024, 1024, 128), 1.0, 0, "aligned shapes waste nothing");
    cr_assert_float_eq(mxu_utilization(32, 10, 128, 128), 10.0 / 128, 1e-12, "a 10-wide layer uses 8%");
    cr_assert_float_eq(mxu_utilization(4, 128, 128, 128), 0.5, 1e-12, "rows pad to 8");
    free(a), free(b), free(c);
}

Test(mxu, bad_shapes_are_refused)
{
    float x[4] = {0};
    struct mxu_op zero = {0, 1, 1, 0, 0, 0, 0, 0}, neg = {1, -2, 1, 0, 0, 0, 0, 0};
    err e;
    cr_assert_eq(mxu_matmul(u, MXU_DEFAULT, &zero, x, x, x, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "m=0"), "%s", e.msg);
    cr_assert_eq(mxu_matmul(u, MXU_DEFAULT, &neg, x, x, x, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(mxu_matmul(u, MXU_DEFAULT, &neg, NULL, x, x, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(mxu_matmul(u, (mxu_precision)7, &(struct mxu_op){1, 1, 1, 0, 0, 0, 0, 0}, x, x, x, NULL, &e),
                 CODE_INVALID_ARGUMENT);
}

/* The portable matrix unit (a deterministic compile): each C[i][j] is the
 * float32 sum over k in order 0..k-1, from +0, of the products of the
 * bf16-rounded inputs, every product and sum rounded on its own: the sum a
 * plain loop computes (volatile keeps the compiler from fusing it into an
 * FMA here). The same math as the TPU's MXU at precision DEFAULT (bf16
 * inputs, float32 accumulation; XLA's PrecisionConfig.DEFAULT,
 * tensorflow/compiler/xla/xla_data.proto), with one fixed order. */
static void sequential(const struct mxu_op *op, const float *a, const float *b, float *c, int round)
{
    for (int64_t i = 0; i < op->m; i++)
        for (int64_t j = 0; j < op->n; j++) {
            float s = 0.0f;
            for (int64_t p = 0; p < op->k; p++) {
                float x = op->trans_a ? a[p * op->m + i] : a[i * op->k + p];
                float y = op->trans_b ? b[j * op->k + p] : b[p * op->n + j];
                volatile float prod;
                if (round) {
                    x = bf16_to_f32(bf16_from_f32(x));
                    y = bf16_to_f32(bf16_from_f32(y));
                }
                prod = x * y;
                s = s + prod;
            }
            c[i * op->n + j] = op->accumulate ? c[i * op->n + j] + s : s;
        }
}

Test(mxu, fixed_unit_sums_in_order_bit_for_bit)
{
    static const int64_t shapes[][3] = {{128, 128, 784}, {7, 10, 128}, {784, 128, 128}, {5, 3, 1}, {1, 1, 9}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int t = 0; t < 8; t++) {
            struct mxu_op op = {shapes[s][0], shapes[s][1], shapes[s][2], t & 1, (t >> 1) & 1, (t >> 2) & 1, 0, 0};
            size_t na = (size_t)(op.m * op.k), nb = (size_t)(op.k * op.n), nc = (size_t)(op.m * op.n);
            float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c = malloc(nc * sizeof *c),
                  *want = malloc(nc * sizeof *want);
            double *ref = malloc(nc * sizeof *ref);
            for (int p = 0; p < 2; p++) {
                mxu_precision prec = p ? MXU_HIGHEST : MXU_DEFAULT;
                struct mxu_stats st;
                err e;
                fill(a, na, 11 + (unsigned)s);
                fill(b, nb, 29 + (unsigned)t);
                fill(c, nc, 3);
                memcpy(want, c, nc * sizeof *c);
                cr_assert_eq(mxu_matmul_fixed(u, prec, &op, a, b, c, &st, &e), CODE_OK, "%s", e.msg);
                sequential(&op, a, b, want, !p);
                cr_assert(memcmp(c, want, nc * sizeof *c) == 0,
                          "%lldx%lldx%lld trans %d/%d acc %d %s: not the in-order float32 sum", (long long)op.m,
                          (long long)op.n, (long long)op.k, op.trans_a, op.trans_b, op.accumulate,
                          p ? "HIGHEST" : "DEFAULT");
                cr_assert_gt(st.flops, 0.0);
                if (!op.accumulate) { /* and the product itself: close to the exact one */
                    reference(&op, a, b, ref, !p);
                    cr_assert_lt(max_err(c, ref, nc), 1e-5 * (double)op.k, "far from the exact product");
                }
            }
            free(a), free(b), free(c), free(want), free(ref);
        }
}

Test(mxu, fixed_unit_refuses_bad_shapes)
{
    struct mxu_op op = {0, 4, 4, 0, 0, 0, 0, 0};
    float x[16] = {0}, y[16] = {0}, z[16];
    err e;
    cr_assert_eq(mxu_matmul_fixed(u, MXU_DEFAULT, &op, x, y, z, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "m=0"), "%s", e.msg);
    op.m = 4;
    cr_assert_eq(mxu_matmul_fixed(u, (mxu_precision)7, &op, x, y, z, NULL, &e), CODE_INVALID_ARGUMENT);
}
