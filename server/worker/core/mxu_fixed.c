/* The portable matrix unit's kernel (mxu.h, mxu_matmul_fixed): C = A . B with
 * A m x k and B k x n float32 (already rounded to bfloat16 for precision
 * DEFAULT, so each product of two bfloat16 values is exact in float32), each
 * C[i][j] accumulated in float32 over kk = 0, 1, ..., k-1 in that order,
 * starting from +0, one product rounded then one sum rounded at a time.
 *
 * Built with -O3 -ffp-contract=off and no -march: the vectors run across j
 * (columns of B and C; GCC's vector extension for blocks of 32 columns kept
 * in registers, the compiler's vectorizer for the rest), which leaves every
 * element's sequence of roundings as written; nothing reassociates a sum (no -ffast-math) and no
 * multiply-add is fused. The clones for AVX-512 and AVX2 below do the same
 * per-lane operations as the baseline SSE2 one, each correctly rounded by
 * IEEE 754, so every clone, on every host, gives the same bits. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "mxu_fixed.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GEMM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define GEMM_CLONES
#endif

typedef float v16 __attribute__((vector_size(64)));

/* C[i0..i0+3][j0..j0+31] over all of k, kept in eight vector accumulators:
 * each lane is one element of C, summed over kk in order */
__attribute__((always_inline)) static inline void block4x32(size_t K, size_t N, const float *a0, const float *a1, const float *a2,
                             const float *a3, const float *b, size_t j0, float *c, int accumulate)
{
    v16 r00 = {0}, r01 = {0}, r10 = {0}, r11 = {0}, r20 = {0}, r21 = {0}, r30 = {0}, r31 = {0};
    for (size_t kk = 0; kk < K; kk++) {
        const float *br = b + kk * N + j0;
        v16 b0, b1;
        memcpy(&b0, br, sizeof b0);
        memcpy(&b1, br + 16, sizeof b1);
        v16 x0 = {0}, x1 = {0}, x2 = {0}, x3 = {0};
        x0 += a0[kk], x1 += a1[kk], x2 += a2[kk], x3 += a3[kk];   /* broadcasts (0 + x is x exactly) */
        r00 = r00 + x0 * b0, r01 = r01 + x0 * b1;
        r10 = r10 + x1 * b0, r11 = r11 + x1 * b1;
        r20 = r20 + x2 * b0, r21 = r21 + x2 * b1;
        r30 = r30 + x3 * b0, r31 = r31 + x3 * b1;
    }
    v16 r[4][2] = {{r00, r01}, {r10, r11}, {r20, r21}, {r30, r31}};
    for (int q = 0; q < 4; q++)
        for (int h = 0; h < 2; h++) {
            float *cp = c + (size_t)q * N + j0 + 16 * (size_t)h;
            v16 v = r[q][h];
            if (accumulate) {
                v16 old;
                memcpy(&old, cp, sizeof old);
                v = old + v;
            }
            memcpy(cp, &v, sizeof v);
        }
}

/* four rows of C at a time: 32-column blocks in registers, the rest of the
 * columns through a row of accumulators sharing each row of B they read */
GEMM_CLONES
void mxu_fixed_gemm(int64_t m, int64_t n, int64_t k, const float *restrict a, const float *restrict b,
                    float *restrict c, int accumulate, float *restrict acc)
{
    size_t N = (size_t)n, K = (size_t)k, jb = N / 32 * 32;
    int64_t i = 0;

    for (; i + 4 <= m; i += 4) {
        const float *a0 = a + (size_t)i * K, *a1 = a0 + K, *a2 = a1 + K, *a3 = a2 + K;
        float *ci = c + (size_t)i * N;
        for (size_t j0 = 0; j0 < jb; j0 += 32)
            block4x32(K, N, a0, a1, a2, a3, b, j0, ci, accumulate);
        if (jb < N) {
            size_t T = N - jb;
            float *restrict r0 = acc, *restrict r1 = acc + T, *restrict r2 = acc + 2 * T, *restrict r3 = acc + 3 * T;
            for (size_t j = 0; j < T; j++)
                r0[j] = r1[j] = r2[j] = r3[j] = 0.0f;
            for (size_t kk = 0; kk < K; kk++) {
                const float *restrict br = b + kk * N + jb;
                float x0 = a0[kk], x1 = a1[kk], x2 = a2[kk], x3 = a3[kk];
                for (size_t j = 0; j < T; j++) {
                    float bj = br[j];
                    r0[j] = r0[j] + x0 * bj;
                    r1[j] = r1[j] + x1 * bj;
                    r2[j] = r2[j] + x2 * bj;
                    r3[j] = r3[j] + x3 * bj;
                }
            }
            for (int q = 0; q < 4; q++) {
                float *restrict cr = ci + (size_t)q * N + jb;
                const float *restrict rq = acc + (size_t)q * T;
                if (accumulate)
                    for (size_t j = 0; j < T; j++)
                        cr[j] = cr[j] + rq[j];
                else
                    for (size_t j = 0; j < T; j++)
                        cr[j] = rq[j];
            }
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
