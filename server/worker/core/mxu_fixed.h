/* The portable matrix unit's kernel (mxu_fixed.c): C[m x n] (+)= A[m x k] .
 * B[k x n], row-major float32, each element summed over k in order from +0.
 * acc is scratch for 4 x n floats. Used through mxu_matmul_fixed (mxu.h). */
#ifndef TPUEMU_WORKER_MXU_FIXED_H
#define TPUEMU_WORKER_MXU_FIXED_H

#include <stdint.h>

void mxu_fixed_gemm(int64_t m, int64_t n, int64_t k, const float *a, const float *b, float *c, int accumulate,
                    float *acc);

#endif
