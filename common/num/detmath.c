/* The fixed transcendentals (contract in detmath.h). Range reduction with
 * constants split so that n * HI is exact, then a Taylor polynomial long
 * enough that its truncation is below half an ulp of double, evaluated by
 * Horner's rule. Built with -ffp-contract=off: every product is rounded
 * before it is added. */
#include "detmath.h"

#include <math.h>

/* ln 2 split: LN2_HI has its low 32 bits zero, so n * LN2_HI is exact for |n| < 2^20 */
#define LN2_HI 6.93147180369123816490e-01
#define LN2_LO 1.90821492927058770002e-10
#define INV_LN2 1.44269504088896338700e+00
/* pi/2 in three pieces of 33 bits each (Cody and Waite) */
#define PIO2_1 1.57079632673412561417e+00
#define PIO2_2 6.07710050650619224932e-11
#define PIO2_3 2.02226624879595063154e-21
#define INV_PIO2 6.36619772367581382433e-01

double det_exp(double x)
{
    double n, r, p;
    if (x != x)
        return x;
    if (x > 709.782712893384)
        return HUGE_VAL;
    if (x < -745.2)
        return 0.0;
    n = floor(x * INV_LN2 + 0.5);
    r = (x - n * LN2_HI) - n * LN2_LO;   /* |r| <= 0.347 */
    /* e^r = sum r^k / k!, k <= 14: 0.347^15 / 15! < 1e-19 */
    p = 1.0 / 87178291200.0;
    p = p * r + 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    return ldexp(p, (int)n);   /* exact scaling (rounded once if subnormal) */
}

double det_log(double x)
{
    double m, s, z, p;
    int e;
    if (x != x)
        return x;
    if (x < 0.0)
        return NAN;
    if (x == 0.0)
        return -HUGE_VAL;
    if (isinf(x))
        return x;
    m = frexp(x, &e);   /* x = m 2^e, m in [0.5, 1): exact */
    if (m < 0.70710678118654752440) {
        m *= 2.0;
        e--;
    }
    /* log m = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.1716: terms to s^25 */
    s = (m - 1.0) / (m + 1.0);
    z = s * s;
    p = 1.0 / 25.0;
    p = p * z + 1.0 / 23.0;
    p = p * z + 1.0 / 21.0;
    p = p * z + 1.0 / 19.0;
    p = p * z + 1.0 / 17.0;
    p = p * z + 1.0 / 15.0;
    p = p * z + 1.0 / 13.0;
    p = p * z + 1.0 / 11.0;
    p = p * z + 1.0 / 9.0;
    p = p * z + 1.0 / 7.0;
    p = p * z + 1.0 / 5.0;
    p = p * z + 1.0 / 3.0;
    p = p * z + 1.0;
    return (double)e * LN2_HI + ((double)e * LN2_LO + 2.0 * s * p);
}

/* sin and cos of r, |r| <= pi/4 (Taylor to r^17 and r^18: below 1e-19) */
static double sin_r(double r)
{
    double z = r * r, p = 1.0 / 355687428096000.0;
    p = p * z - 1.0 / 1307674368000.0;
    p = p * z + 1.0 / 6227020800.0;
    p = p * z - 1.0 / 39916800.0;
    p = p * z + 1.0 / 362880.0;
    p = p * z - 1.0 / 5040.0;
    p = p * z + 1.0 / 120.0;
    p = p * z - 1.0 / 6.0;
    return r + r * (z * p);
}

static double cos_r(double r)
{
    double z = r * r, p = -1.0 / 6402373705728000.0;
    p = p * z + 1.0 / 20922789888000.0;
    p = p * z - 1.0 / 87178291200.0;
    p = p * z + 1.0 / 479001600.0;
    p = p * z - 1.0 / 3628800.0;
    p = p * z + 1.0 / 40320.0;
    p = p * z - 1.0 / 720.0;
    p = p * z + 1.0 / 24.0;
    p = p * z - 0.5;
    return 1.0 + z * p;
}

double det_cos(double x)
{
    double n, r;
    long q;
    if (x != x || fabs(x) > 1048576.0)
        return NAN;
    n = floor(x * INV_PIO2 + 0.5);
    r = ((x - n * PIO2_1) - n * PIO2_2) - n * PIO2_3;
    q = (long)n & 3;
    switch (q) {
    case 0:
        return cos_r(r);
    case 1:
        return -sin_r(r);
    case 2:
        return -cos_r(r);
    default:
        return sin_r(r);
    }
}

double det_pow(double b, double p)
{
    if (b != b || p != p)
        return NAN;
    if (p == 0.0)
        return 1.0;
    if (b == 0.0)
        return p > 0.0 ? 0.0 : HUGE_VAL;
    if (b < 0.0)
        return NAN;
    if (b == 1.0)
        return 1.0;
    return det_exp(p * det_log(b));
}

double det_tanh(double x)
{
    double a = fabs(x), t;
    if (x != x)
        return x;
    if (a > 20.0)
        t = 1.0;
    else if (a < 1e-4)   /* x - x^3/3 + 2x^5/15: the rest is below 1e-30 relative */
        t = a - a * a * a / 3.0 + 2.0 * a * a * a * a * a / 15.0;
    else
        t = 1.0 - 2.0 / (det_exp(2.0 * a) + 1.0);
    return x < 0.0 ? -t : t;
}

float det_expf(float x)
{
    return (float)det_exp((double)x);
}

float det_logf(float x)
{
    return (float)det_log((double)x);
}

float det_tanhf(float x)
{
    return (float)det_tanh((double)x);
}
