/* Activations, losses from logits and normalization layers of the core
 * (norm.h). */
#include "norm.h"

#include <math.h>
#include <string.h>

#include "detmath.h"

/* erf from erfc's Chebyshev fit (Numerical Recipes' erfcc: relative error
 * under 1.2e-7 everywhere), in double with the host-independent exp. */
static double det_erf(double x)
{
    double z = fabs(x), t = 1.0 / (1.0 + 0.5 * z);
    double r = t * det_exp(-z * z - 1.26551223 +
                           t * (1.00002368 +
                                t * (0.37409196 +
                                     t * (0.09678418 +
                                          t * (-0.18628806 +
                                               t * (0.27886807 +
                                                    t * (-1.13520398 +
                                                         t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))));
    return x >= 0.0 ? 1.0 - r : r - 1.0;
}

static float erf_of(float x, int det)
{
    return det ? (float)det_erf((double)x) : erff(x);
}

#define INV_SQRT2 0.70710678118654752440f
#define INV_SQRT2PI 0.39894228040143267794f

void actx_forward(float *v, const float *b, int rows, int n, enum model_act act, int det, float *pre)
{
    float (*ex)(float) = det ? det_expf : expf, (*lg)(float) = det ? det_logf : logf;
    for (int r = 0; r < rows; r++) {
        float *restrict vr = v + (size_t)r * (size_t)n, *restrict zr = pre + (size_t)r * (size_t)n;
        for (int j = 0; j < n; j++) {
            float z = vr[j] + b[j], y;
            zr[j] = z;
            switch (act) {
            case ACT_GELU:
                y = 0.5f * z * (1.0f + erf_of(z * INV_SQRT2, det));
                break;
            case ACT_SOFTPLUS:
                y = (z > 0.0f ? z : 0.0f) + lg(1.0f + ex(-fabsf(z)));
                break;
            case ACT_SWISH:
                y = z / (1.0f + ex(-z));
                break;
            default:
                y = z;
                break;
            }
            vr[j] = y;
        }
    }
}

void actx_backward(float *d, const float *pre, size_t len, enum model_act act, int det)
{
    float (*ex)(float) = det ? det_expf : expf;
    for (size_t i = 0; i < len; i++) {
        float z = pre[i], s;
        switch (act) {
        case ACT_GELU: /* Phi(z) + z phi(z) */
            d[i] *= 0.5f * (1.0f + erf_of(z * INV_SQRT2, det)) + z * INV_SQRT2PI * ex(-0.5f * z * z);
            break;
        case ACT_SOFTPLUS: /* sigmoid(z) */
            d[i] *= 1.0f / (1.0f + ex(-z));
            break;
        case ACT_SWISH: /* s + z s (1 - s) */
            s = 1.0f / (1.0f + ex(-z));
            d[i] *= s + z * s * (1.0f - s);
            break;
        default:
            break;
        }
    }
}

float logits_row_loss(enum model_loss loss, const float *z, int n, const float *y, int cls, float *g, int det)
{
    float (*ex)(float) = det ? det_expf : expf, (*lg)(float) = det ? det_logf : logf;
    float mx = z[0], s = 0.0f, lse, l = 0.0f, ysum = 0.0f;
    for (int j = 1; j < n; j++)
        mx = z[j] > mx ? z[j] : mx;
    for (int j = 0; j < n; j++)
        s += ex(z[j] - mx);
    lse = mx + lg(s);
    if (loss == LOSS_SPARSE_CCE) {
        if (g) {
            for (int j = 0; j < n; j++)
                g[j] = ex(z[j] - mx) / s;
            g[cls] -= 1.0f;
        }
        return lse - z[cls];
    }
    for (int j = 0; j < n; j++) {
        l += y[j] * (lse - z[j]);
        ysum += y[j];
    }
    if (g)
        for (int j = 0; j < n; j++)
            g[j] = ex(z[j] - mx) / s * ysum - y[j];
    return l;
}

void ln_forward(const float *x, size_t npos, int C, float eps, const float *gamma, const float *beta, float *y,
                float *xhat, float *rstd)
{
    for (size_t p = 0; p < npos; p++) {
        const float *restrict xp = x + p * (size_t)C;
        float *restrict yp = y + p * (size_t)C, *restrict hp = xhat + p * (size_t)C;
        float mean = 0.0f, var = 0.0f, r;
        for (int c = 0; c < C; c++)
            mean += xp[c];
        mean /= (float)C;
        for (int c = 0; c < C; c++)
            var += (xp[c] - mean) * (xp[c] - mean);
        var /= (float)C;
        r = 1.0f / sqrtf(var + eps);
        rstd[p] = r;
        for (int c = 0; c < C; c++) {
            hp[c] = (xp[c] - mean) * r;
            yp[c] = gamma[c] * hp[c] + beta[c];
        }
    }
}

void ln_backward(const float *dy, const float *xhat, const float *rstd, size_t npos, int C, const float *gamma,
                 float *dgamma, float *dbeta, float *dx)
{
    memset(dgamma, 0, (size_t)C * sizeof *dgamma);
    memset(dbeta, 0, (size_t)C * sizeof *dbeta);
    for (size_t p = 0; p < npos; p++) {
        const float *restrict g = dy + p * (size_t)C, *restrict h = xhat + p * (size_t)C;
        float sg = 0.0f, sgh = 0.0f;
        for (int c = 0; c < C; c++) {
            dgamma[c] += g[c] * h[c];
            dbeta[c] += g[c];
        }
        if (!dx)
            continue;
        for (int c = 0; c < C; c++) {
            float gc = gamma[c] * g[c];
            sg += gc;
            sgh += gc * h[c];
        }
        sg /= (float)C;
        sgh /= (float)C;
        float *restrict d = dx + p * (size_t)C;
        for (int c = 0; c < C; c++)
            d[c] = rstd[p] * (gamma[c] * g[c] - sg - h[c] * sgh);
    }
}

void bn_forward(const float *x, size_t npos, int C, float eps, int training, const float *gamma, const float *beta,
                const float *mm, const float *mv, float *y, float *xhat, float *st)
{
    float *mean = st, *var = st + C, *rstd = st + 2 * (size_t)C;
    if (training) {
        memset(mean, 0, 2 * (size_t)C * sizeof *mean);
        for (size_t p = 0; p < npos; p++)
            for (int c = 0; c < C; c++)
                mean[c] += x[p * (size_t)C + (size_t)c];
        for (int c = 0; c < C; c++)
            mean[c] /= (float)npos;
        for (size_t p = 0; p < npos; p++)
            for (int c = 0; c < C; c++) {
                float d = x[p * (size_t)C + (size_t)c] - mean[c];
                var[c] += d * d;
            }
        for (int c = 0; c < C; c++)
            var[c] /= (float)npos;
    } else {
        memcpy(mean, mm, (size_t)C * sizeof *mean);
        memcpy(var, mv, (size_t)C * sizeof *var);
    }
    for (int c = 0; c < C; c++)
        rstd[c] = 1.0f / sqrtf(var[c] + eps);
    for (size_t p = 0; p < npos; p++) {
        const float *restrict xp = x + p * (size_t)C;
        float *restrict yp = y + p * (size_t)C, *restrict hp = xhat + p * (size_t)C;
        for (int c = 0; c < C; c++) {
            hp[c] = (xp[c] - mean[c]) * rstd[c];
            yp[c] = gamma[c] * hp[c] + beta[c];
        }
    }
}

void bn_backward(const float *dy, const float *xhat, const float *st, size_t npos, int C, int training,
                 const float *gamma, float *dgamma, float *dbeta, float *dx)
{
    const float *rstd = st + 2 * (size_t)C;
    memset(dgamma, 0, (size_t)C * sizeof *dgamma);
    memset(dbeta, 0, (size_t)C * sizeof *dbeta);
    for (size_t p = 0; p < npos; p++)
        for (int c = 0; c < C; c++) {
            size_t i = p * (size_t)C + (size_t)c;
            dgamma[c] += dy[i] * xhat[i];
            dbeta[c] += dy[i];
        }
    if (!dx)
        return;
    for (size_t p = 0; p < npos; p++)
        for (int c = 0; c < C; c++) {
            size_t i = p * (size_t)C + (size_t)c;
            float k = gamma[c] * rstd[c];
            dx[i] = training ? k * (dy[i] - dbeta[c] / (float)npos - xhat[i] * (dgamma[c] / (float)npos)) : k * dy[i];
        }
}

static int sum_over(model_allreduce_fn fn, void *ctx, float *buf, size_t n, err *e)
{
    return fn ? fn(ctx, buf, n, e) : 0;
}

int bn_forward_sync(const float *x, size_t npos, int C, float eps, const float *gamma, const float *beta, float *y,
                    float *xhat, float *st, float *scratch, model_allreduce_fn fn, void *ctx, err *e)
{
    float *mean = st, *var = st + C, *rstd = st + 2 * (size_t)C;
    double n;
    memset(scratch, 0, ((size_t)C + 2) * sizeof *scratch);
    for (size_t p = 0; p < npos; p++)
        for (int c = 0; c < C; c++)
            scratch[c] += x[p * (size_t)C + (size_t)c];
    /* the count in two exact parts: float sums of integers below 2^24 are exact */
    scratch[C] = (float)(npos >> 12);
    scratch[C + 1] = (float)(npos & 4095u);
    if (sum_over(fn, ctx, scratch, (size_t)C + 2, e))
        return -1;
    n = (double)scratch[C] * 4096.0 + (double)scratch[C + 1];
    st[3 * (size_t)C] = (float)n;
    for (int c = 0; c < C; c++)
        mean[c] = n > 0 ? (float)((double)scratch[c] / n) : 0.0f;
    memset(scratch, 0, (size_t)C * sizeof *scratch);
    for (size_t p = 0; p < npos; p++)
        for (int c = 0; c < C; c++) {
            float d = x[p * (size_t)C + (size_t)c] - mean[c];
            scratch[c] += d * d;
        }
    if (sum_over(fn, ctx, scratch, (size_t)C, e))
        return -1;
    for (int c = 0; c < C; c++) {
        var[c] = n > 0 ? (float)((double)scratch[c] / n) : 0.0f;
        rstd[c] = 1.0f / sqrtf(var[c] + eps);
    }
    for (size_t p = 0; p < npos; p++) {
        const float *restrict xp = x + p * (size_t)C;
        float *restrict yp = y + p * (size_t)C, *restrict hp = xhat + p * (size_t)C;
        for (int c = 0; c < C; c++) {
            hp[c] = (xp[c] - mean[c]) * rstd[c];
            yp[c] = gamma[c] * hp[c] + beta[c];
        }
    }
    return 0;
}

int bn_backward_sync(const float *dy, const float *xhat, const float *st, size_t npos, int C, const float *gamma,
                     float *dgamma, float *dbeta, float *dx, float *scratch, model_allreduce_fn fn, void *ctx, err *e)
{
    const float *rstd = st + 2 * (size_t)C;
    float n = st[3 * (size_t)C];
    /* this shard's sums are its gradients of gamma and beta (the gradient
     * all-reduce adds the replicas'); dx needs the sums over all of them */
    bn_backward(dy, xhat, st, npos, C, 1, gamma, dgamma, dbeta, NULL);
    memcpy(scratch, dbeta, (size_t)C * sizeof *scratch);
    memcpy(scratch + C, dgamma, (size_t)C * sizeof *scratch);
    if (sum_over(fn, ctx, scratch, 2 * (size_t)C, e))
        return -1;
    for (size_t p = 0; dx && p < npos; p++)
        for (int c = 0; c < C; c++) {
            size_t i = p * (size_t)C + (size_t)c;
            float k = gamma[c] * rstd[c];
            dx[i] = k * (dy[i] - scratch[c] / n - xhat[i] * (scratch[C + c] / n));
        }
    return 0;
}
