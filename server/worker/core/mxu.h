/* The matrix unit of one emulated core: C = op(A) . op(B) with bfloat16 inputs
 * and float32 accumulation, as the TPU's MXU computes it (XLA precision
 * DEFAULT), or in float32 throughout (precision HIGHEST).
 *
 * It runs on oneDNN's matmul primitive, single-threaded: one worker is one core,
 * and a GEMM that spreads over the host's cores collapses as soon as the other
 * workers on the machine run too. Each distinct shape's primitive is created
 * once and cached (creation costs far more than a small GEMM).
 *
 * Every call also reports what it would cost the real MXU: the useful FLOPs
 * over the FLOPs of the shape padded to the MXU tile, so a layer 100 wide
 * shows it wastes 22% of a 128x128 systolic array.
 *
 * Not thread-safe: one mxu per thread. It may be created on one thread and used
 * on another (each call sets that thread's OpenMP thread count to 1). */
#ifndef TPUEMU_WORKER_MXU_H
#define TPUEMU_WORKER_MXU_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef enum mxu_precision {
    MXU_DEFAULT = 0,   /* bfloat16 inputs, float32 accumulation (jax.lax.Precision.DEFAULT) */
    MXU_HIGHEST = 1,   /* float32 inputs and accumulation (Precision.HIGHEST) */
} mxu_precision;

/* One matmul: C[m x n] = op(A)[m x k] . op(B)[k x n], all row-major and dense.
 * A is stored m x k, or k x m when trans_a (op(A) = A^T); B is stored k x n,
 * or n x k when trans_b. accumulate adds into C (C += ...) instead of
 * overwriting it, for gradients summed over micro-batches. */
struct mxu_op {
    int64_t m, n, k;
    int trans_a, trans_b;
    int accumulate;
    /* The operand already holds bfloat16 values (bf16_round_n's output):
     * DEFAULT takes it as it is instead of rounding it again. */
    int exact_a, exact_b;
};

/* What one call did. */
struct mxu_stats {
    double flops;          /* 2*m*n*k: the useful work */
    double padded_flops;   /* 2*pad(m,8)*pad(n,tile)*pad(k,tile): what the MXU spends */
    double utilization;    /* flops / padded_flops, in (0, 1] */
    double seconds;        /* wall time of the GEMM on this host */
};

typedef struct mxu mxu;

/* A matrix unit with tile x tile systolic arrays (128 up to v5p, 256 on v6e).
 * CODE_INTERNAL if oneDNN cannot make a CPU engine. Free with mxu_free. */
int mxu_new(mxu **out, unsigned tile, err *e);
void mxu_free(mxu *u);

/* bfloat16 inputs (raw bits, see bf16.h), float32 output: the MXU proper.
 * CODE_INVALID_ARGUMENT for a shape with a dimension < 1 or above 2^31, or
 * missing buffers; CODE_INTERNAL if oneDNN refuses the shape. stats may be NULL. */
int mxu_matmul_bf16(mxu *u, const struct mxu_op *op, const uint16_t *a, const uint16_t *b, float *c,
                    struct mxu_stats *stats, err *e);

/* float32 inputs. DEFAULT rounds A and B to bfloat16 first (nearest even, as
 * XLA does) and multiplies in bfloat16 with float32 accumulation; HIGHEST
 * multiplies in float32. Same errors as mxu_matmul_bf16. */
int mxu_matmul(mxu *u, mxu_precision p, const struct mxu_op *op, const float *a, const float *b, float *c,
               struct mxu_stats *stats, err *e);

/* The portable matrix unit (a deterministic compile): the same product as
 * mxu_matmul (DEFAULT: inputs rounded to bfloat16, products exact, float32
 * sums; HIGHEST: float32 throughout) without oneDNN, each element of C summed
 * over k in order 0..k-1 from +0 with every product and sum rounded on its
 * own (no FMA), so the bits do not depend on the host's CPU or on which
 * kernel oneDNN would pick for its ISA (see mxu_fixed.c). With accumulate,
 * C += that sum. Slower than oneDNN (bench/train.sh DETERMINISTIC=1 measures
 * it). Same errors as mxu_matmul. */
int mxu_matmul_fixed(mxu *u, mxu_precision p, const struct mxu_op *op, const float *a, const float *b, float *c,
                     struct mxu_stats *stats, err *e);

/* The MXU utilization of a shape on a tile x tile array (see mxu_stats). */
double mxu_utilization(int64_t m, int64_t n, int64_t k, unsigned tile);

/* Primitives created since mxu_new (a cache miss each), and cached now. */
unsigned mxu_primitives_created(const mxu *u);
unsigned mxu_primitives_cached(const mxu *u);
/* 1 when DEFAULT precision runs on oneDNN's bf16 matmul (CPUs with a bf16
 * dot product: AVX512-BF16, AMX); 0 when its bfloat16 inputs are widened to
 * float32 (exactly) for oneDNN's float32 matmul, which elsewhere is several
 * times faster than oneDNN's emulated bf16 kernel and exists below AVX-512,
 * where that one does not. Both are bf16 inputs with float32 sums. The
 * environment variable TPUEMU_MXU_BF16=onednn or =f32, read by mxu_new,
 * picks one. */
int mxu_bf16_native(const mxu *u);

#endif
