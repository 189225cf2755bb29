/* Transcendentals that give the same bits on every x86-64 (and every other
 * IEEE-754) host: exp, log, cos, pow and tanh from additions,
 * multiplications and divisions in double (each correctly rounded), in a
 * fixed order, with no FMA contraction (detmath.c is built with
 * -ffp-contract=off) and no table chosen by the CPU. libm's expf, logf, cos
 * and pow are not: glibc picks FMA variants at run time on CPUs that have
 * FMA, whose last bit may differ from the others'.
 *
 * Accuracy: within 1 ulp of the exact result in double for the float
 * arguments the model and the schedules give (the float versions round the
 * double result once), which is what tests/unit/test_detmath.c checks
 * against libm. Special values as C99 Annex F: exp(-inf) = 0, exp(inf) = inf,
 * log(0) = -inf, log(x < 0) = NaN, NaN in -> NaN out.
 *
 * Pure and thread-safe. */
#ifndef TPUEMU_COMMON_DETMATH_H
#define TPUEMU_COMMON_DETMATH_H

double det_exp(double x);
double det_log(double x);
double det_cos(double x);   /* |x| up to 2^20; NaN beyond (the schedules stay in [0, pi]) */
double det_pow(double b, double p);   /* b > 0: exp(p log b); b == 0: 0 for p > 0, 1 for p == 0 */
double det_tanh(double x);

float det_expf(float x);
float det_logf(float x);
float det_tanhf(float x);

#endif
