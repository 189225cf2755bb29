/* bench/mxu: GFLOP/s of the emulated matrix unit (bf16 x bf16 -> f32 on
 * oneDNN, one thread; widened to its float32 matmul on CPUs without a bf16
 * dot product, with oneDNN's own emulated bf16 matmul beside it) on square shapes and on the training shapes of
 * Dense(784->128) -> Dense(128->10), next to this machine's bf16 peak (a short
 * vdpbf16ps loop), the same shapes in float32 (precision HIGHEST) and on the
 * portable matrix unit of a deterministic compile (mxu_matmul_fixed).
 *
 *   build/bin/bench_mxu [--quick]
 *
 * Prints one table; the goal is >= 80% of the measured peak on shapes with
 * N, K >= 128 (marked *). Single-threaded by design: one worker is one core. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bf16.h"
#include "mxu.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#if defined(__x86_64__)
/* 16 independent accumulators hide vdpbf16ps' latency (12 reach only ~90% of
 * the throughput here); each instruction is 16 lanes x 2 multiply-adds = 64
 * FLOPs. */
#define PEAK_ACC 16
__attribute__((target("avx512f,avx512bf16"), noinline)) static double peak_window(double seconds)
{
    __m512 acc[PEAK_ACC];
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3c00);
    long iters = 0;
    double t0 = now(), t;
    float sink = 0;

    for (int i = 0; i < PEAK_ACC; i++)
        acc[i] = _mm512_setzero_ps();
    do {
        for (int r = 0; r < 256; r++) {
#pragma GCC unroll 16
            for (int i = 0; i < PEAK_ACC; i++)
                acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
        }
        iters += 256;
        t = now() - t0;
    } while (t < seconds);
    for (int i = 0; i < PEAK_ACC; i++)
        sink += _mm512_reduce_add_ps(acc[i]);
    if (sink == 12345.0f)
        puts("");
    return (double)iters * PEAK_ACC * 64 / t;
}

static double peak_bf16(double seconds)
{
    double best = 0;
    for (double t0 = now(); now() - t0 < seconds;) {
        double r = peak_window(0.001);
        if (r > best)
            best = r;
    }
    return best;
}
#endif

struct shape {
    const char *name;
    struct mxu_op op;
};

static void fill(float *x, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
}

/* GFLOP/s of op in the given precision (bf16: 1 the unit from bf16 inputs,
 * oneDNN bf16 or widened to float32 as the CPU decides; 0 oneDNN float32;
 * 2 the portable unit of a deterministic compile from float32 inputs, its
 * bf16 rounding included): warm up (creates the primitive), then repeat for
 * at least `seconds`. */
static double gflops(mxu *u, const struct mxu_op *op, int bf16, double seconds, double *util)
{
    size_t na = (size_t)(op->m * op->k), nb = (size_t)(op->k * op->n), nc = (size_t)(op->m * op->n);
    float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c = malloc(nc * sizeof *c);
    uint16_t *ha = malloc(na * sizeof *ha), *hb = malloc(nb * sizeof *hb);
    struct mxu_stats st;
    double t0, t, best = 0, flops = 2.0 * (double)op->m * (double)op->n * (double)op->k;
    long reps = 0;
    err e;
    int rc;

    if (!a || !b || !c || !ha || !hb) {
        fprintf(stderr, "bench_mxu: out of memory\n");
        exit(1);
    }
    fill(a, na, 1);
    fill(b, nb, 2);
    bf16_from_f32_n(ha, a, na);
    bf16_from_f32_n(hb, b, nb);
#define CALL() (bf16 == 2 ? mxu_matmul_fixed(u, MXU_DEFAULT, op, a, b, c, &st, &e) \
                : bf16    ? mxu_matmul_bf16(u, op, ha, hb, c, &st, &e)                 \
                          : mxu_matmul(u, MXU_HIGHEST, op, a, b, c, &st, &e))
    if ((rc = CALL()) != CODE_OK) {
        fprintf(stderr, "bench_mxu: %s\n", e.msg);
        exit(1);
    }
    *util = st.utilization;
    /* the fastest single call: other processes on this machine only ever slow
     * a call down (the scheduler's slices are milliseconds long, so most short
     * calls run undisturbed) */
    t0 = now();
    do {
        double c0 = now();
        CALL();
        t = now() - c0;
        if (best == 0 || t < best)
            best = t;
        reps++;
    } while (now() - t0 < seconds || reps < 3);
#undef CALL
    free(a), free(b), free(c), free(ha), free(hb);
    return flops / best / 1e9;
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    double secs = quick ? 0.1 : 0.5, peak = 0;
    struct shape shapes[32];
    int ns = 0;
    mxu *u;
    err e;

    if (mxu_new(&u, 128, &e) != CODE_OK) {
        fprintf(stderr, "bench_mxu: %s\n", e.msg);
        return 1;
    }
    for (int s = 256; s <= 2048; s *= 2) {
        static char names[4][32];
        int i = ns;
        snprintf(names[i], sizeof names[i], "square %d", s);
        shapes[ns++] = (struct shape){names[i], {s, s, s, 0, 0, 0, 0, 0}};
    }
    static const int batches[] = {32, 128, 1024};
    for (int i = 0; i < 3; i++) {
        static char names[3][5][48];
        int bsz = batches[i];
        snprintf(names[i][0], 48, "b%-4d fwd   x.W1      [B,784].[784,128]", bsz);
        shapes[ns++] = (struct shape){names[i][0], {bsz, 128, 784, 0, 0, 0, 0, 0}};
        snprintf(names[i][1], 48, "b%-4d fwd   h.W2      [B,128].[128,10]", bsz);
        shapes[ns++] = (struct shape){names[i][1], {bsz, 10, 128, 0, 0, 0, 0, 0}};
        snprintf(names[i][2], 48, "b%-4d bwd   dy.W2^T   [B,10].[10,128]", bsz);
        shapes[ns++] = (struct shape){names[i][2], {bsz, 128, 10, 0, 1, 0, 0, 0}};
        snprintf(names[i][3], 48, "b%-4d bwd   h^T.dy    [128,B].[B,10]", bsz);
        shapes[ns++] = (struct shape){names[i][3], {128, 10, bsz, 1, 0, 0, 0, 0}};
        snprintf(names[i][4], 48, "b%-4d bwd   x^T.dh    [784,B].[B,128]", bsz);
        shapes[ns++] = (struct shape){names[i][4], {784, 128, bsz, 1, 0, 0, 0, 0}};
    }

    /* measure every row first, then the peak before and after (the larger one
     * counts): a busy machine only ever lowers a figure */
    double bfs[32], f32s[32], fixed[32], emul[32], utils[32];
    /* where the unit widens, oneDNN's own (emulated) bf16 matmul beside it */
    mxu *ou = NULL;
    if (!mxu_bf16_native(u)) {
        setenv("TPUEMU_MXU_BF16", "onednn", 1);
        if (mxu_new(&ou, 128, &e) != CODE_OK)
            ou = NULL;
        unsetenv("TPUEMU_MXU_BF16");
    }
    for (int i = 0; i < ns; i++) {
        bfs[i] = gflops(u, &shapes[i].op, 1, secs, &utils[i]);
        emul[i] = ou ? gflops(ou, &shapes[i].op, 1, secs, &utils[i]) : 0;
        if (ou && !mxu_bf16_native(ou)) /* oneDNN has no bf16 matmul at all here */
            emul[i] = 0;
        f32s[i] = gflops(u, &shapes[i].op, 0, secs, &utils[i]);
        fixed[i] = gflops(u, &shapes[i].op, 2, secs, &utils[i]);
    }
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512bf16")) {
        peak = peak_bf16(quick ? 0.2 : 1.0) / 1e9;
        double again = peak_bf16(quick ? 0.2 : 1.0) / 1e9;
        if (again > peak)
            peak = again;
    }
#endif
    printf("matrix unit: oneDNN %s matmul, 1 thread; bf16 conversion path: %s\n",
           mxu_bf16_native(u) ? "bf16 x bf16 -> f32" : "f32 (bf16 inputs widened: no bf16 dot product on this CPU)",
           bf16_path());
    if (peak > 0)
        printf("measured bf16 peak of this core (vdpbf16ps loop): %.1f GFLOP/s\n\n", peak);
    else
        printf("no AVX512-BF16 on this CPU: no measured peak\n\n");
    printf("%-40s %6s %6s %6s  %9s %7s  %9s %10s %11s %7s\n", "shape (* = N,K >= 128)", "M", "N", "K",
           "bf16 GF/s", "% peak", "fp32 GF/s", "fixed GF/s", "oneDNN bf16", "MXU use");
    for (int i = 0; i < ns; i++) {
        const struct mxu_op *op = &shapes[i].op;
        int goal = op->n >= 128 && op->k >= 128;
        char pct[16] = "-";
        if (peak > 0)
            snprintf(pct, sizeof pct, "%.0f%%", 100.0 * bfs[i] / peak);
        char em[16] = "-";
        if (emul[i] > 0)
            snprintf(em, sizeof em, "%.1f", emul[i]);
        printf("%-38s %s %6lld %6lld %6lld  %9.1f %7s  %9.1f %10.1f %11s %6.0f%%\n", shapes[i].name,
               goal ? "*" : " ", (long long)op->m, (long long)op->n, (long long)op->k, bfs[i], pct, f32s[i],
               fixed[i], em, 100.0 * utils[i]);
    }
    printf("\nMXU use: useful FLOPs over the FLOPs of the shape padded to the 128x128 MXU tile "
           "(N and K to 128, M to 8).\n");
    printf("fixed: the portable matrix unit of a deterministic compile (bf16 rounding of float32 inputs\n"
           "included; in-order float32 sums, no FMA).\n");
    printf("oneDNN bf16: oneDNN's own bf16 matmul, which emulates it on this CPU (the unit widens instead; '-'\n"
           "where the unit runs it natively, or where oneDNN has none).\n");
    printf("primitives created: %u (one per shape and precision)\n", mxu_primitives_created(u));
    mxu_free(ou);
    mxu_free(u);
    return 0;
}
