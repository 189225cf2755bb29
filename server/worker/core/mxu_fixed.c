/* The portable matrix unit's kernel (mxu.h, mxu_matmul_fixed): C = A . B with
 * A m x k and B k x n float32 (already rounded to bfloat16 for precision
 * DEFAULT, so each product of two bfloat16 values is exact in float32), each
 * C[i][j] accumulated in float32 over kk = 0, 1, ..., k-1 in that order,
 * starting from +0, one product rounded then one sum rounded at a time.
 *
 * Built with -O3 -ffp-contract=off and no -march: the compiler vectorizes
 * across j (columns of B and C), which leaves every element's sequence of
 * roundings as written; nothing reassociates a sum (no -ffast-math) and no
 * multiply-add is fused. The clones for AVX-512 and AVX2 below do the same
 * per-lane operations as the baseline SSE2 one, each correctly rounded by
 * IEEE 754, so every clone, on every host, gives the same bits. */
#include <stddef.h>
#include <stdint.h>

#include "mxu_fixed.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GEMM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GEMM_CLONES
#endif

/* four rows of C at a time, sharing each row of B they read */
GEMM_CLONES
void mxu_fixed_gemm(int64_t m, int64_t n, int64_t k, const float *restrict a, const float *restrict b,
                    float *restrict c, int accumulate, float *restrict acc)
{
    size_t N = (size_t)n, K = (size_t)k;
    int64_t i = 0;

    for (; i + 4 <= m; i += 4) {
        float *restrict r0 = acc, *restrict r1 = acc + N, *restrict r2 = acc + 2 * N, *restrict r3 = acc + 3 * N;
        const float *a0 = a + (size_t)i * K, *a1 = a0 + K, *a2 = a1 + K, *a3 = a2 + K;
        for (size_t j = 0; j < N; j++)
            r0[j] = r1[j] = r2[j] = r3[j] = 0.0f;
        for (size_t kk = 0; kk < K; kk++) {
            const float *restrict br = b + kk * N;
            float x0 = a0[kk], x1 = a1[kk], x2 = a2[kk], x3 = a3[kk];
            for (size_t j = 0; j < N; j++) {
                float bj = br[j];
                r0[j] = r0[j] + x0 * bj;
                r1[j] = r1[j] + x1 * bj;
                r2[j] = r2[j] + x2 * bj;
                r3[j] = r3[j] + x3 * bj;
            }
        }
        for (int q = 0; q < 4; q++) {
            float *restrict cr = c + (size_t)(i + q) * N;
            const float *restrict rq = acc + (size_t)q * N;
            if (accumulate)
                for (size_t j = 0; j < N; j++)
                    cr[j] = cr[j] + rq[j];
            else
                for (size_t j = 0; j < N; j++)
                    cr[j] = rq[j];
        }
    }
    for (; i < m; i++) {
        const float *ai = a + (size_t)i * K;
        float *restrict cr = c + (size_t)i * N;
        for (size_t j = 0; j < N; j++)
            acc[j] = 0.0f;
        for (size_t kk = 0; kk < K; kk++) {
            const float *restrict br = b + kk * N;
            float x = ai[kk];
            for (size_t j = 0; j < N; j++)
                acc[j] = acc[j] + x * br[j];
        }
        if (accumulate)
            for (size_t j = 0; j < N; j++)
                cr[j] = cr[j] + acc[j];
        else
            for (size_t j = 0; j < N; j++)
                cr[j] = acc[j];
    }
}
