/* The matrix unit on oneDNN's matmul primitive: one cached primitive per
 * shape, executed single-threaded. It owns no tensors; the caller's buffers
 * are bound to the primitive for the duration of one call. */
#include "mxu.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include "bf16.h"
#include "mxu_fixed.h"
#include "tuning.h"

#define MXU_CACHE_MAX 64     /* shapes kept; the least recently used goes first */
#define MXU_DIM_MAX (1ll << 31)

struct entry {
    struct mxu_op op;
    dnnl_data_type_t dt;     /* dnnl_bf16 or dnnl_f32 inputs */
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
    uint64_t used;           /* tick of the last use */
};

struct mxu {
    unsigned tile;
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    struct entry cache[MXU_CACHE_MAX];
    unsigned ncache, created;
    uint64_t tick;
    uint16_t *abuf, *bbuf;   /* bf16 copies of float32 inputs (precision DEFAULT) */
    size_t acap, bcap;
    float *fa, *fb, *facc;   /* the portable unit's operands, normalized, and its row accumulators */
    size_t facap, fbcap, fccap;
    int bf16_native;         /* bf16 inputs go to oneDNN's bf16 matmul; else widened to float32 (see mxu_new) */
};

static void entry_free(struct entry *en)
{
    if (en->prim)
        dnnl_primitive_destroy(en->prim);
    if (en->a)
        dnnl_memory_destroy(en->a);
    if (en->b)
        dnnl_memory_destroy(en->b);
    if (en->c)
        dnnl_memory_destroy(en->c);
    memset(en, 0, sizeof *en);
}

/* Whether DEFAULT precision runs on oneDNN's bf16 matmul. Only CPUs with a
 * bf16 dot product (AVX512-BF16, AMX) run it natively; elsewhere oneDNN 2.x
 * either has none (below AVX-512) or emulates it, converting the inputs inside
 * its kernel at about a fifth of its own float32 speed (31 against 156 GFLOP/s
 * on a 128 x 784 x 128 product on an AVX-512 Xeon without AVX512-BF16,
 * bench_mxu). There the inputs are rounded to bfloat16 and widened back to
 * float32 (exact), and oneDNN's float32 matmul multiplies them: a product of
 * two bfloat16 values is exact in float32, so this is the MXU's arithmetic
 * too, bf16 inputs and float32 sums, only summed in another order.
 * TPUEMU_MXU_BF16=onednn or =f32 picks one for a measurement. */
static int bf16_native(void)
{
    const char *force = tuning_get()->mxu_bf16;
    if (strcmp(force, "onednn") == 0)
        return 1;
    if (strcmp(force, "f32") == 0)
        return 0;
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    return (isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) == (unsigned)dnnl_cpu_isa_avx512_core_bf16;
}

int mxu_new(mxu **out, unsigned tile, err *e)
{
    mxu *u;

    *out = NULL;
    if (tile == 0 || tile > 4096)
        return err_set(e, CODE_INVALID_ARGUMENT, "MXU tile %u is not a systolic array size (128 or 256)",
                       tile);
    if (!(u = calloc(1, sizeof *u)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of host memory for the matrix unit");
    u->tile = tile;
    u->bf16_native = bf16_native();
    omp_set_num_threads(1);
    if (dnnl_engine_create(&u->eng, dnnl_cpu, 0) != dnnl_success) {
        free(u);
        return err_set(e, CODE_INTERNAL, "oneDNN: cannot create a CPU engine for the matrix unit");
    }
    if (dnnl_stream_create(&u->stream, u->eng, dnnl_stream_default_flags) != dnnl_success) {
        dnnl_engine_destroy(u->eng);
        free(u);
        return err_set(e, CODE_INTERNAL, "oneDNN: cannot create a CPU stream for the matrix unit");
    }
    *out = u;
    return CODE_OK;
}

void mxu_free(mxu *u)
{
    if (!u)
        return;
    for (unsigned i = 0; i < u->ncache; i++)
        entry_free(&u->cache[i]);
    dnnl_stream_destroy(u->stream);
    dnnl_engine_destroy(u->eng);
    free(u->abuf);
    free(u->bbuf);
    free(u->fa);
    free(u->fb);
    free(u->facc);
    free(u);
}

static int64_t pad(int64_t x, int64_t to)
{
    return (x + to - 1) / to * to;
}

double mxu_utilization(int64_t m, int64_t n, int64_t k, unsigned tile)
{
    /* The weights tile is k x n; rows of the left operand stream through it in
     * groups of 8 (the vector unit's sublanes), so m pads to 8 only. */
    if (m < 1 || n < 1 || k < 1 || tile == 0)
        return 0.0;
    return ((double)m * (double)n * (double)k) /
           ((double)pad(m, 8) * (double)pad(n, tile) * (double)pad(k, tile));
}

unsigned mxu_primitives_created(const mxu *u)
{
    return u->created;
}

int mxu_bf16_native(const mxu *u)
{
    return u->bf16_native;
}

unsigned mxu_primitives_cached(const mxu *u)
{
    return u->ncache;
}

static int same_op(const struct mxu_op *x, const struct mxu_op *y)
{
    return x->m == y->m && x->n == y->n && x->k == y->k && !x->trans_a == !y->trans_a &&
           !x->trans_b == !y->trans_b && !x->accumulate == !y->accumulate;
}

static int create(mxu *u, struct entry *en, err *e)
{
    const struct mxu_op *op = &en->op;
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_dims_t ad = {op->m, op->k}, bd = {op->k, op->n}, cd = {op->m, op->n};
    dnnl_dims_t as = {op->k, 1}, bs = {op->n, 1}, cs = {op->n, 1};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st;
    const char *what = "describe the operands";

    if (op->trans_a)
        as[0] = 1, as[1] = op->m;   /* stored k x m */
    if (op->trans_b)
        bs[0] = 1, bs[1] = op->k;   /* stored n x k */
    if ((st = dnnl_memory_desc_init_by_strides(&amd, 2, ad, en->dt, as)) != dnnl_success ||
        (st = dnnl_memory_desc_init_by_strides(&bmd, 2, bd, en->dt, bs)) != dnnl_success ||
        (st = dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs)) != dnnl_success ||
        (what = "describe the matmul",
         st = dnnl_matmul_desc_init(&desc, &amd, &bmd, NULL, &cmd)) != dnnl_success ||
        (what = "set attributes", st = dnnl_primitive_attr_create(&attr)) != dnnl_success)
        goto fail;
    if (op->accumulate &&
        ((st = dnnl_post_ops_create(&po)) != dnnl_success ||
         (st = dnnl_post_ops_append_sum(po, 1.0f)) != dnnl_success ||
         (st = dnnl_primitive_attr_set_post_ops(attr, po)) != dnnl_success))
        goto fail;
    what = "create the primitive";
    if ((st = dnnl_primitive_desc_create(&pd, &desc, attr, u->eng, NULL)) != dnnl_success ||
        (st = dnnl_primitive_create(&en->prim, pd)) != dnnl_success)
        goto fail;
    what = "create memory objects";
    if ((st = dnnl_memory_create(&en->a, &amd, u->eng, DNNL_MEMORY_NONE)) != dnnl_success ||
        (st = dnnl_memory_create(&en->b, &bmd, u->eng, DNNL_MEMORY_NONE)) != dnnl_success ||
        (st = dnnl_memory_create(&en->c, &cmd, u->eng, DNNL_MEMORY_NONE)) != dnnl_success)
        goto fail;
    dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    u->created++;
    return CODE_OK;
fail:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (po)
        dnnl_post_ops_destroy(po);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (en->dt == dnnl_bf16 && st == dnnl_unimplemented)
        u->bf16_native = 0; /* forced where oneDNN has none: widen from now on */
    /* before entry_free zeroes the entry op points into */
    err_set(e, CODE_INTERNAL, "matrix unit: oneDNN cannot %s for %s %lldx%lld . %lldx%lld (status %d)%s", what,
            en->dt == dnnl_bf16 ? "bf16" : "f32", (long long)op->m, (long long)op->k, (long long)op->k,
            (long long)op->n, (int)st, en->dt == dnnl_bf16 && st == dnnl_unimplemented
                                            ? "; oneDNN has no bf16 matmul for this CPU (it needs AVX-512)"
                                            : "");
    entry_free(en);
    return CODE_INTERNAL;
}

/* The cached primitive for op, created on a miss (evicting the least recently
 * used shape when the cache is full). */
static int lookup(mxu *u, const struct mxu_op *op, dnnl_data_type_t dt, struct entry **out, err *e)
{
    struct entry *en = NULL;
    unsigned i;
    int rc;

    for (i = 0; i < u->ncache; i++)
        if (u->cache[i].dt == dt && same_op(&u->cache[i].op, op)) {
            en = &u->cache[i];
            break;
        }
    if (!en) {
        if (u->ncache < MXU_CACHE_MAX) {
            en = &u->cache[u->ncache++];
        } else {
            en = &u->cache[0];
            for (i = 1; i < u->ncache; i++)
                if (u->cache[i].used < en->used)
                    en = &u->cache[i];
            entry_free(en);
        }
        en->op = *op;
        en->op.trans_a = !!op->trans_a;
        en->op.trans_b = !!op->trans_b;
        en->op.accumulate = !!op->accumulate;
        en->dt = dt;
        if ((rc = create(u, en, e)) != CODE_OK) {
            /* keep the cache dense: move the last entry into the hole */
            struct entry *last = &u->cache[--u->ncache];
            if (en != last) {
                *en = *last;
                memset(last, 0, sizeof *last);
            }
            return rc;
        }
    }
    en->used = ++u->tick;
    *out = en;
    return CODE_OK;
}

static int check(const struct mxu_op *op, const void *a, const void *b, const float *c, err *e)
{
    if (!op || !a || !b || !c)
        return err_set(e, CODE_INVALID_ARGUMENT, "matmul: missing operand buffer");
    if (op->m < 1 || op->n < 1 || op->k < 1 || op->m > MXU_DIM_MAX || op->n > MXU_DIM_MAX ||
        op->k > MXU_DIM_MAX)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "matmul: shape m=%lld n=%lld k=%lld is not valid (each between 1 and 2^31)",
                       (long long)op->m, (long long)op->n, (long long)op->k);
    return CODE_OK;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int run(mxu *u, const struct mxu_op *op, dnnl_data_type_t dt, const void *a, const void *b, float *c,
               struct mxu_stats *stats, err *e)
{
    struct entry *en;
    dnnl_exec_arg_t args[3];
    dnnl_status_t st;
    double t0;
    int rc;

    omp_set_num_threads(1);   /* per thread in OpenMP: the caller may be a pool thread */
    if ((rc = lookup(u, op, dt, &en, e)) != CODE_OK)
        return rc;
    t0 = now();
    dnnl_memory_set_data_handle(en->a, (void *)(uintptr_t)a);
    dnnl_memory_set_data_handle(en->b, (void *)(uintptr_t)b);
    dnnl_memory_set_data_handle(en->c, c);
    args[0] = (dnnl_exec_arg_t){DNNL_ARG_SRC, en->a};
    args[1] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, en->b};
    args[2] = (dnnl_exec_arg_t){DNNL_ARG_DST, en->c};
    if ((st = dnnl_primitive_execute(en->prim, u->stream, 3, args)) != dnnl_success ||
        (st = dnnl_stream_wait(u->stream)) != dnnl_success)
        return err_set(e, CODE_INTERNAL, "matrix unit: oneDNN matmul %lldx%lldx%lld failed (status %d)",
                       (long long)op->m, (long long)op->n, (long long)op->k, (int)st);
    if (stats) {
        stats->seconds = now() - t0;
        stats->flops = 2.0 * (double)op->m * (double)op->n * (double)op->k;
        stats->utilization = mxu_utilization(op->m, op->n, op->k, u->tile);
        stats->padded_flops = stats->flops / stats->utilization;
    }
    return CODE_OK;
}

/* buf grown to room for n > *cap elements of size elem (what it held is
 * kept), or NULL when out of memory (buf is then unchanged). */
static void *grow_buf(void *buf, size_t *cap, size_t n, size_t elem)
{
    void *p = realloc(buf, n * elem);
    if (p)
        *cap = n;
    return p;
}

static int growf(float **buf, size_t *cap, size_t n, err *e)
{
    float *p;
    if (n <= *cap)
        return CODE_OK;
    if (!(p = grow_buf(*buf, cap, n, sizeof *p)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "matmul: out of host memory for %zu float32 values", n);
    *buf = p;
    return CODE_OK;
}

/* op on bfloat16 operands through oneDNN's float32 matmul (see bf16_native):
 * a and b widened into the unit's float32 buffers, in their stored layout. */
static int run_widened(mxu *u, const struct mxu_op *op, const uint16_t *a, const uint16_t *b, float *c,
                       struct mxu_stats *stats, err *e)
{
    size_t na = (size_t)op->m * (size_t)op->k, nb = (size_t)op->k * (size_t)op->n;
    int rc;
    if ((rc = growf(&u->fa, &u->facap, na, e)) != CODE_OK || (rc = growf(&u->fb, &u->fbcap, nb, e)) != CODE_OK)
        return rc;
    bf16_to_f32_n(u->fa, a, na);
    bf16_to_f32_n(u->fb, b, nb);
    return run(u, op, dnnl_f32, u->fa, u->fb, c, stats, e);
}

/* bf16 operands on whichever kernel this CPU runs best; a forced native run
 * that oneDNN refuses as unimplemented widens, now and from then on. */
static int run_bf16(mxu *u, const struct mxu_op *op, const uint16_t *a, const uint16_t *b, float *c,
                    struct mxu_stats *stats, err *e)
{
    int rc;
    if (u->bf16_native && ((rc = run(u, op, dnnl_bf16, a, b, c, stats, e)) == CODE_OK || u->bf16_native))
        return rc;
    err_clear(e);
    return run_widened(u, op, a, b, c, stats, e);
}

int mxu_matmul_bf16(mxu *u, const struct mxu_op *op, const uint16_t *a, const uint16_t *b, float *c,
                    struct mxu_stats *stats, err *e)
{
    int rc;
    if ((rc = check(op, a, b, c, e)) != CODE_OK)
        return rc;
    return run_bf16(u, op, a, b, c, stats, e);
}

static int grow(uint16_t **buf, size_t *cap, size_t n, err *e)
{
    uint16_t *p;
    if (n <= *cap)
        return CODE_OK;
    if (!(p = grow_buf(*buf, cap, n, sizeof *p)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "matmul: out of host memory for %zu bf16 values", n);
    *buf = p;
    return CODE_OK;
}

int mxu_matmul(mxu *u, mxu_precision p, const struct mxu_op *op, const float *a, const float *b, float *c,
               struct mxu_stats *stats, err *e)
{
    size_t na, nb;
    int rc;

    if ((rc = check(op, a, b, c, e)) != CODE_OK)
        return rc;
    if (p == MXU_HIGHEST)
        return run(u, op, dnnl_f32, a, b, c, stats, e);
    if (p != MXU_DEFAULT)
        return err_set(e, CODE_INVALID_ARGUMENT, "matmul: precision %d is neither DEFAULT nor HIGHEST", (int)p);
    na = (size_t)op->m * (size_t)op->k;
    nb = (size_t)op->k * (size_t)op->n;
    if (!u->bf16_native) { /* widened: round in place of a copy, one pass each (see bf16_native) */
        if ((!op->exact_a && (rc = growf(&u->fa, &u->facap, na, e)) != CODE_OK) ||
            (!op->exact_b && (rc = growf(&u->fb, &u->fbcap, nb, e)) != CODE_OK))
            return rc;
        if (!op->exact_a)
            bf16_round_n(u->fa, a, na);
        if (!op->exact_b)
            bf16_round_n(u->fb, b, nb);
        return run(u, op, dnnl_f32, op->exact_a ? a : u->fa, op->exact_b ? b : u->fb, c, stats, e);
    }
    if ((rc = grow(&u->abuf, &u->acap, na, e)) != CODE_OK || (rc = grow(&u->bbuf, &u->bcap, nb, e)) != CODE_OK)
        return rc;
    bf16_from_f32_n(u->abuf, a, na);
    bf16_from_f32_n(u->bbuf, b, nb);
    return run_bf16(u, op, u->abuf, u->bbuf, c, stats, e);
}

/* dst[r x c] = src (stored r x c, or c x r when trans), each value rounded to
 * bfloat16 and back when bf (exact, as the MXU's inputs are) */
static void normalize(float *restrict dst, const float *restrict src, int64_t r, int64_t c, int trans, int bf)
{
    size_t R = (size_t)r, C = (size_t)c;
    if (!trans && bf) { /* the array rounding's vector path, exact to the scalar one */
        bf16_round_n(dst, src, R * C);
        return;
    }
    if (!trans) {
        memcpy(dst, src, R * C * sizeof *dst);
        return;
    }
    for (size_t i = 0; i < R; i++)
        for (size_t j = 0; j < C; j++) {
            float v = src[j * R + i];
            dst[i * C + j] = bf ? bf16_to_f32(bf16_from_f32(v)) : v;
        }
}

int mxu_matmul_fixed(mxu *u, mxu_precision p, const struct mxu_op *op, const float *a, const float *b, float *c,
                     struct mxu_stats *stats, err *e)
{
    size_t na, nb;
    double t0;
    int rc;

    if ((rc = check(op, a, b, c, e)) != CODE_OK)
        return rc;
    if (p != MXU_DEFAULT && p != MXU_HIGHEST)
        return err_set(e, CODE_INVALID_ARGUMENT, "matmul: precision %d is neither DEFAULT nor HIGHEST", (int)p);
    na = (size_t)op->m * (size_t)op->k;
    nb = (size_t)op->k * (size_t)op->n;
    if ((rc = growf(&u->fa, &u->facap, na, e)) != CODE_OK || (rc = growf(&u->fb, &u->fbcap, nb, e)) != CODE_OK ||
        (rc = growf(&u->facc, &u->fccap, 4 * (size_t)op->n, e)) != CODE_OK)
        return rc;
    t0 = now();
    normalize(u->fa, a, op->m, op->k, op->trans_a, p == MXU_DEFAULT && !op->exact_a);
    normalize(u->fb, b, op->k, op->n, op->trans_b, p == MXU_DEFAULT && !op->exact_b);
    mxu_fixed_gemm(op->m, op->n, op->k, u->fa, u->fb, c, op->accumulate, u->facc);
    if (stats) {
        stats->seconds = now() - t0;
        stats->flops = 2.0 * (double)op->m * (double)op->n * (double)op->k;
        stats->utilization = mxu_utilization(op->m, op->n, op->k, u->tile);
        stats->padded_flops = stats->flops / stats->utilization;
    }
    return CODE_OK;
}
