/* The sequence layers of the emulated core (attention.h). */
#include "attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "detmath.h"

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static double unit(uint64_t key, uint64_t i) /* [0, 1) */
{
    return (double)(mix(key ^ i) >> 11) * 0x1p-53;
}

/* ---- Embedding ---- */

int embed_forward(const struct lspec *sp, const struct lshape *in, const float *w, const float *x, int rows, float *out,
                  err *e)
{
    size_t S = (size_t)in->d[0], D = (size_t)sp->units;
    const float *pos = w + (size_t)sp->vocab * D;
    for (int r = 0; r < rows; r++)
        for (size_t s = 0; s < S; s++) {
            float v = x[(size_t)r * S + s];
            float *o = out + ((size_t)r * S + s) * D;
            if (!(v >= 0.0f && v < (float)sp->vocab) || v != floorf(v))
                return err_set(e, CODE_INVALID_ARGUMENT,
                               "Embedding: row %d, position %zu: token id %g is not an integer in 0..%d "
                               "(input_dim %d)",
                               r, s, (double)v, sp->vocab - 1, sp->vocab);
            memcpy(o, w + (size_t)v * D, D * sizeof *o);
            if (sp->positions)
                for (size_t j = 0; j < D; j++)
                    o[j] += pos[s * D + j];
        }
    return CODE_OK;
}

void embed_backward(const struct lspec *sp, const struct lshape *in, const float *x, int rows, const float *dy,
                    float *gw)
{
    size_t S = (size_t)in->d[0], D = (size_t)sp->units;
    size_t n = (size_t)sp->vocab * D + (sp->positions ? S * D : 0);
    float *gpos = gw + (size_t)sp->vocab * D;
    memset(gw, 0, n * sizeof *gw);
    for (int r = 0; r < rows; r++) /* ids were checked by the forward pass */
        for (size_t s = 0; s < S; s++) {
            const float *d = dy + ((size_t)r * S + s) * D;
            float *g = gw + (size_t)x[(size_t)r * S + s] * D;
            for (size_t j = 0; j < D; j++)
                g[j] += d[j];
            if (sp->positions)
                for (size_t j = 0; j < D; j++)
                    gpos[s * D + j] += d[j];
        }
}

void embed_init(float *w, size_t n, uint64_t key)
{
    for (size_t i = 0; i < n; i++)
        w[i] = (float)((2.0 * unit(key, i) - 1.0) * 0.05);
}

/* ---- MultiHeadAttention ---- */

struct attn {
    int S, F, H, Kd, Vd, HK, HV;
    float scale;
    /* kept from the forward pass, head-major (row, head, position, dim) */
    float *q, *k, *v; /* q scaled by 1/sqrt(key_dim) */
    float *p;         /* the attention weights: (row, head) x S x S */
    float *o;         /* the heads' outputs, concatenated: (row, position) x HV */
    /* scratch */
    float *t;            /* a projection before it goes head-major, or its gradient: rows*S x max(HK, HV) */
    float *dh;           /* a head-major gradient: rows x H x S x max(Kd, Vd) */
    float *dp;           /* the weights' gradient: like p */
    float *dq, *dk, *dv; /* the projections' gradients, (row, position) x HK or HV */
};

/* the offsets of the weights in the layer's block */
struct aoff {
    size_t qk, qb, kk, kb, vk, vb, ok, ob;
};

static struct aoff offsets(int F, int HK, int HV)
{
    struct aoff o;
    size_t f = (size_t)F, hk = (size_t)HK, hv = (size_t)HV;
    o.qk = 0;
    o.qb = o.qk + f * hk;
    o.kk = o.qb + hk;
    o.kb = o.kk + f * hk;
    o.vk = o.kb + hk;
    o.vb = o.vk + f * hv;
    o.ok = o.vb + hv;
    o.ob = o.ok + hv * f;
    return o;
}

static void dims(const struct lspec *sp, const struct lshape *in, int *S, int *F, int *H, int *Kd, int *Vd)
{
    *S = in->d[0];
    *F = in->d[1];
    *H = sp->heads;
    *Kd = sp->key_dim;
    *Vd = sp->value_dim ? sp->value_dim : sp->key_dim;
}

static float *fl(size_t a, size_t b)
{
    if (b && a > SIZE_MAX / sizeof(float) / b)
        return NULL;
    return calloc(a * b > 0 ? a * b : 1, sizeof(float));
}

void attn_free(attn *a)
{
    if (!a)
        return;
    free(a->q);
    free(a->k);
    free(a->v);
    free(a->p);
    free(a->o);
    free(a->t);
    free(a->dh);
    free(a->dp);
    free(a->dq);
    free(a->dk);
    free(a->dv);
    free(a);
}

attn *attn_new(const struct lspec *sp, const struct lshape *in, int max_rows)
{
    attn *a = calloc(1, sizeof *a);
    size_t R = (size_t)max_rows, rs, wide;
    if (!a)
        return NULL;
    dims(sp, in, &a->S, &a->F, &a->H, &a->Kd, &a->Vd);
    a->HK = a->H * a->Kd;
    a->HV = a->H * a->Vd;
    a->scale = (float)(1.0 / sqrt((double)a->Kd));
    rs = R * (size_t)a->S;
    wide = (size_t)(a->HK > a->HV ? a->HK : a->HV);
    if (!(a->q = fl(rs, (size_t)a->HK)) || !(a->k = fl(rs, (size_t)a->HK)) || !(a->v = fl(rs, (size_t)a->HV)) ||
        !(a->p = fl(R * (size_t)a->H * (size_t)a->S, (size_t)a->S)) || !(a->o = fl(rs, (size_t)a->HV)) ||
        !(a->t = fl(rs, wide)) || !(a->dh = fl(rs, wide)) ||
        !(a->dp = fl(R * (size_t)a->H * (size_t)a->S, (size_t)a->S)) || !(a->dq = fl(rs, (size_t)a->HK)) ||
        !(a->dk = fl(rs, (size_t)a->HK)) || !(a->dv = fl(rs, (size_t)a->HV))) {
        attn_free(a);
        return NULL;
    }
    return a;
}

/* (row, position, head*d + j) <-> (row, head, position, j) */
static void to_heads(const float *src, int rows, int S, int H, int d, float *dst)
{
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < H; h++)
            for (int s = 0; s < S; s++)
                memcpy(dst + (((size_t)r * (size_t)H + (size_t)h) * (size_t)S + (size_t)s) * (size_t)d,
                       src + ((size_t)r * (size_t)S + (size_t)s) * (size_t)H * (size_t)d + (size_t)h * (size_t)d,
                       (size_t)d * sizeof *dst);
}

static void from_heads(const float *src, int rows, int S, int H, int d, float *dst)
{
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < H; h++)
            for (int s = 0; s < S; s++)
                memcpy(dst + ((size_t)r * (size_t)S + (size_t)s) * (size_t)H * (size_t)d + (size_t)h * (size_t)d,
                       src + (((size_t)r * (size_t)H + (size_t)h) * (size_t)S + (size_t)s) * (size_t)d,
                       (size_t)d * sizeof *dst);
}

static void add_bias(float *z, const float *b, size_t rows, int n)
{
    for (size_t r = 0; r < rows; r++)
        for (int j = 0; j < n; j++)
            z[r * (size_t)n + (size_t)j] += b[j];
}

static void colsum(const float *d, size_t rows, int n, float *db)
{
    memcpy(db, d, (size_t)n * sizeof *db);
    for (size_t r = 1; r < rows; r++)
        for (int j = 0; j < n; j++)
            db[j] += d[r * (size_t)n + (size_t)j];
}

#define MM(op, batch, M, N, K, ta, tb, A, sa, B, sb, C, sc, acc)                                                    \
    do {                                                                                                            \
        int rc_ = mm->fn(mm->ctx, (op), (batch), (M), (N), (K), (ta), (tb), (A), (sa), (B), (sb), (C), (sc), (acc), \
                         e);                                                                                        \
        if (rc_ != CODE_OK)                                                                                         \
            return rc_;                                                                                             \
    } while (0)

int attn_forward(attn *a, const struct seq_mm *mm, const float *w, const float *x, int rows, float *y, err *e)
{
    struct aoff o = offsets(a->F, a->HK, a->HV);
    int64_t RS = (int64_t)rows * a->S, S = a->S, BH = (int64_t)rows * a->H;

    float (*ex)(float) = mm->det ? det_expf : expf;

    /* the projections */
    MM(0, 1, RS, a->HK, a->F, 0, 0, x, 0, w + o.qk, 0, a->t, 0, 0);
    add_bias(a->t, w + o.qb, (size_t)RS, a->HK);
    for (size_t i = 0, n = (size_t)RS * (size_t)a->HK; i < n; i++)
        a->t[i] *= a->scale;
    to_heads(a->t, rows, a->S, a->H, a->Kd, a->q);
    MM(0, 1, RS, a->HK, a->F, 0, 0, x, 0, w + o.kk, 0, a->t, 0, 0);
    add_bias(a->t, w + o.kb, (size_t)RS, a->HK);
    to_heads(a->t, rows, a->S, a->H, a->Kd, a->k);
    MM(0, 1, RS, a->HV, a->F, 0, 0, x, 0, w + o.vk, 0, a->t, 0, 0);
    add_bias(a->t, w + o.vb, (size_t)RS, a->HV);
    to_heads(a->t, rows, a->S, a->H, a->Vd, a->v);
    /* scores Q K^T per (row, head), the softmax over the keys */
    MM(0, BH, S, S, a->Kd, 0, 1, a->q, S * a->Kd, a->k, S * a->Kd, a->p, S * S, 0);
    for (size_t i = 0, n = (size_t)BH * (size_t)a->S; i < n; i++) {
        float *v = a->p + i * (size_t)a->S, mx = v[0], sum = 0.0f;
        for (int j = 1; j < a->S; j++)
            mx = v[j] > mx ? v[j] : mx;
        for (int j = 0; j < a->S; j++) {
            v[j] = ex(v[j] - mx);
            sum += v[j];
        }
        for (int j = 0; j < a->S; j++)
            v[j] /= sum;
    }
    /* P V per (row, head), the heads concatenated, the output projection */
    MM(0, BH, S, a->Vd, S, 0, 0, a->p, S * S, a->v, S * a->Vd, a->dh, S * a->Vd, 0);
    from_heads(a->dh, rows, a->S, a->H, a->Vd, a->o);
    MM(0, 1, RS, a->F, a->HV, 0, 0, a->o, 0, w + o.ok, 0, y, 0, 0);
    add_bias(y, w + o.ob, (size_t)RS, a->F);
    return CODE_OK;
}

int attn_backward(attn *a, const struct seq_mm *mm, const float *w, const float *x, int rows, const float *dy,
                  float *gw, float *dx, err *e)
{
    struct aoff o = offsets(a->F, a->HK, a->HV);
    int64_t RS = (int64_t)rows * a->S, S = a->S, BH = (int64_t)rows * a->H;

    /* the output projection */
    MM(1, 1, a->HV, a->F, RS, 1, 0, a->o, 0, dy, 0, gw + o.ok, 0, 0);
    colsum(dy, (size_t)RS, a->F, gw + o.ob);
    MM(2, 1, RS, a->HV, a->F, 0, 1, dy, 0, w + o.ok, 0, a->t, 0, 0);
    to_heads(a->t, rows, a->S, a->H, a->Vd, a->dh); /* dO */
    /* dP = dO V^T, dV = P^T dO */
    MM(2, BH, S, S, a->Vd, 0, 1, a->dh, S * a->Vd, a->v, S * a->Vd, a->dp, S * S, 0);
    MM(2, BH, S, a->Vd, S, 1, 0, a->p, S * S, a->dh, S * a->Vd, a->t, S * a->Vd, 0);
    from_heads(a->t, rows, a->S, a->H, a->Vd, a->dv);
    /* through the softmax: dS = P (dP - rowsum(dP P)) */
    for (size_t i = 0, n = (size_t)BH * (size_t)a->S; i < n; i++) {
        float *g = a->dp + i * (size_t)a->S;
        const float *p = a->p + i * (size_t)a->S;
        float s = 0.0f;
        for (int j = 0; j < a->S; j++)
            s += g[j] * p[j];
        for (int j = 0; j < a->S; j++)
            g[j] = (g[j] - s) * p[j];
    }
    /* dQ = dS K (times the scale: Q was scaled), dK = dS^T Q */
    MM(2, BH, S, a->Kd, S, 0, 0, a->dp, S * S, a->k, S * a->Kd, a->dh, S * a->Kd, 0);
    for (size_t i = 0, n = (size_t)RS * (size_t)a->HK; i < n; i++)
        a->dh[i] *= a->scale;
    from_heads(a->dh, rows, a->S, a->H, a->Kd, a->dq);
    MM(2, BH, S, a->Kd, S, 1, 0, a->dp, S * S, a->q, S * a->Kd, a->dh, S * a->Kd, 0);
    from_heads(a->dh, rows, a->S, a->H, a->Kd, a->dk);
    /* the input projections */
    MM(1, 1, a->F, a->HK, RS, 1, 0, x, 0, a->dq, 0, gw + o.qk, 0, 0);
    colsum(a->dq, (size_t)RS, a->HK, gw + o.qb);
    MM(1, 1, a->F, a->HK, RS, 1, 0, x, 0, a->dk, 0, gw + o.kk, 0, 0);
    colsum(a->dk, (size_t)RS, a->HK, gw + o.kb);
    MM(1, 1, a->F, a->HV, RS, 1, 0, x, 0, a->dv, 0, gw + o.vk, 0, 0);
    colsum(a->dv, (size_t)RS, a->HV, gw + o.vb);
    if (dx) {
        MM(2, 1, RS, a->F, a->HK, 0, 1, a->dq, 0, w + o.qk, 0, dx, 0, 0);
        MM(2, 1, RS, a->F, a->HK, 0, 1, a->dk, 0, w + o.kk, 0, dx, 0, 1);
        MM(2, 1, RS, a->F, a->HV, 0, 1, a->dv, 0, w + o.vk, 0, dx, 0, 1);
    }
    return CODE_OK;
}

static void glorot(float *w, size_t n, double fan_in, double fan_out, uint64_t key, size_t base)
{
    double lim = sqrt(6.0 / (fan_in + fan_out));
    for (size_t i = 0; i < n; i++)
        w[i] = (float)((2.0 * unit(key, base + i) - 1.0) * lim);
}

void attn_init(const struct lspec *sp, const struct lshape *in, float *w, uint64_t key)
{
    int S, F, H, Kd, Vd;
    dims(sp, in, &S, &F, &H, &Kd, &Vd);
    struct aoff o = offsets(F, H * Kd, H * Vd);
    double f = F, h = H;
    (void)S;
    /* Keras' fans of a kernel (a, b, c): receptive field a, fan_in b*a, fan_out c*a */
    glorot(w + o.qk, o.qb - o.qk, h * f, Kd * f, key, o.qk);
    glorot(w + o.kk, o.kb - o.kk, h * f, Kd * f, key, o.kk);
    glorot(w + o.vk, o.vb - o.vk, h * f, Vd * f, key, o.vk);
    glorot(w + o.ok, o.ob - o.ok, Vd * h, f * h, key, o.ok);
    memset(w + o.qb, 0, (o.kk - o.qb) * sizeof *w);
    memset(w + o.kb, 0, (o.vk - o.kb) * sizeof *w);
    memset(w + o.vb, 0, (o.ok - o.vb) * sizeof *w);
    memset(w + o.ob, 0, (size_t)F * sizeof *w);
}

int attn_shapes(const struct lspec *sp, const struct lshape *in, int rows, int train, int first, struct seq_shape *out)
{
    int S, F, H, Kd, Vd, n = 0;
    int64_t R = rows, RS, BH;
    dims(sp, in, &S, &F, &H, &Kd, &Vd);
    RS = R * S;
    BH = R * H;
#define SH(op_, b_, m_, n_, k_) (out[n++] = (struct seq_shape){(op_), (b_), (m_), (n_), (k_)})
    if (!train) {
        SH(0, 1, RS, H * Kd, F);
        SH(0, 1, RS, H * Kd, F);
        SH(0, 1, RS, H * Vd, F);
        SH(0, BH, S, S, Kd);
        SH(0, BH, S, Vd, S);
        SH(0, 1, RS, F, H * Vd);
        return n;
    }
    SH(1, 1, H * Vd, F, RS);
    SH(2, 1, RS, H * Vd, F);
    SH(2, BH, S, S, Vd);
    SH(2, BH, S, Vd, S);
    SH(2, BH, S, Kd, S);
    SH(2, BH, S, Kd, S);
    SH(1, 1, F, H * Kd, RS);
    SH(1, 1, F, H * Kd, RS);
    SH(1, 1, F, H * Vd, RS);
    if (!first) {
        SH(2, 1, RS, F, H * Kd);
        SH(2, 1, RS, F, H * Kd);
        SH(2, 1, RS, F, H * Vd);
    }
#undef SH
    return n;
}
