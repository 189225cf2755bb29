/* Learning-rate schedules (common/num/lrsched.c) against Keras' formulas, and the
 * fixed transcendentals they and the deterministic model use
 * (common/num/detmath.c) against libm.
 *
 * The formulas are those of keras/src/optimizers/schedules/
 * learning_rate_schedule.py (TF 2.13+ / Keras 3): ExponentialDecay
 * (initial * rate^(step / decay_steps), staircase flooring the quotient),
 * PiecewiseConstantDecay (values[0] while step <= boundaries[0], ...,
 * values[-1] when step > boundaries[-1]) and CosineDecay (with warmup_target:
 * linear warm-up from initial_learning_rate, then 0.5 * (1 + cos(pi * s /
 * decay_steps)) scaled between alpha and 1, s clamped to decay_steps). Keras
 * evaluates them in float32 (the dtype of a Python float learning rate); the
 * references below do the same, with libm's powf and cosf, and the schedule
 * (double, rounded once) must agree to a few float ulps. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "detmath.h"
#include "lrsched.h"

static void near(float got, float want, float abs_tol, const char *what, uint64_t step)
{
    float tol = abs_tol + 4.0f * FLT_EPSILON * fabsf(want);
    cr_assert(fabsf(got - want) <= tol, "%s at step %llu: %.9g, Keras' formula gives %.9g", what,
              (unsigned long long)step, (double)got, (double)want);
}

/* ExponentialDecay.__call__ in float32 */
static float keras_exponential(float lr0, float decay_steps, float rate, int staircase, uint64_t step)
{
    float p = (float)step / decay_steps;
    if (staircase)
        p = floorf(p);
    return lr0 * powf(rate, p);
}

/* CosineDecay.__call__ in float32 (warmup_target given when has_warmup) */
static float keras_cosine(float lr0, float decay_steps, float alpha, int has_warmup, float target, float warmup,
                          uint64_t step)
{
    float s = (float)step, from = lr0, c;
    if (has_warmup) {
        s = fminf(s, decay_steps + warmup);
        if (s < warmup)
            return (target - lr0) * (s / warmup) + lr0;
        s -= warmup;
        from = target;
    } else {
        s = fminf(s, decay_steps);
    }
    c = 0.5f * (1.0f + cosf((float)M_PI * (s / decay_steps)));
    return from * ((1.0f - alpha) * c + alpha);
}

Test(lrsched, exponential_decay_matches_keras)
{
    /* the docstring's example: ExponentialDecay(0.1, decay_steps=100000, decay_rate=0.96, staircase=True) */
    struct lr_schedule s = {.kind = LRS_EXPONENTIAL, .initial = 0.1f, .decay_steps = 100000, .decay_rate = 0.96f,
                            .staircase = 1};
    cr_assert_eq(lrs_value(&s, 0), 0.1f);
    cr_assert_eq(lrs_value(&s, 99999), 0.1f, "staircase: the rate holds until the boundary");
    near(lrs_value(&s, 100000), 0.096f, 0, "staircase", 100000);
    near(lrs_value(&s, 250000), 0.09216f, 0, "staircase", 250000);
    s.staircase = 0;
    for (uint64_t step = 0; step <= 1000000; step += 12345)
        near(lrs_value(&s, step), keras_exponential(0.1f, 100000, 0.96f, 0, step), 0, "ExponentialDecay", step);
    /* the walk-through's scale: 58 steps an epoch, x0.7 an epoch */
    struct lr_schedule w = {.kind = LRS_EXPONENTIAL, .initial = 0.004f, .decay_steps = 58, .decay_rate = 0.7f};
    for (uint64_t step = 0; step <= 580; step++) {
        near(lrs_value(&w, step), keras_exponential(0.004f, 58, 0.7f, 0, step), 0, "ExponentialDecay", step);
        w.staircase = 1;
        near(lrs_value(&w, step), keras_exponential(0.004f, 58, 0.7f, 1, step), 0, "staircase", step);
        w.staircase = 0;
    }
}

Test(lrsched, piecewise_constant_matches_keras)
{
    /* the docstring's example: boundaries [100000, 110000], values [1.0, 0.5, 0.1] */
    struct lr_schedule s = {.kind = LRS_PIECEWISE, .nbounds = 2, .bounds = {100000, 110000},
                            .values = {1.0f, 0.5f, 0.1f}};
    cr_assert_eq(lrs_value(&s, 0), 1.0f);
    cr_assert_eq(lrs_value(&s, 100000), 1.0f, "step <= boundaries[0]: values[0]");
    cr_assert_eq(lrs_value(&s, 100001), 0.5f);
    cr_assert_eq(lrs_value(&s, 110000), 0.5f);
    cr_assert_eq(lrs_value(&s, 110001), 0.1f);
    cr_assert_eq(lrs_value(&s, UINT64_MAX), 0.1f);
}

Test(lrsched, cosine_decay_matches_keras)
{
    /* the docstring's example with warm-up: 0 -> 0.1 over 1000 steps, then down over 1000 */
    struct lr_schedule s = {.kind = LRS_COSINE, .initial = 0.0f, .decay_steps = 1000, .has_warmup = 1,
                            .warmup_target = 0.1f, .warmup_steps = 1000};
    cr_assert_eq(lrs_value(&s, 0), 0.0f);
    near(lrs_value(&s, 500), 0.05f, 0, "warm-up", 500);
    near(lrs_value(&s, 1000), 0.1f, 0, "peak", 1000);
    near(lrs_value(&s, 1500), 0.05f, 1e-9f, "half way down", 1500);
    near(lrs_value(&s, 2000), 0.0f, 1e-9f, "end", 2000);
    near(lrs_value(&s, 5000), 0.0f, 1e-9f, "after the end (clamped)", 5000);
    for (uint64_t step = 0; step <= 2500; step += 7)
        near(lrs_value(&s, step), keras_cosine(0.0f, 1000, 0, 1, 0.1f, 1000, step), 0.1f * 1e-6f, "CosineDecay", step);
    /* without warm-up, with a floor alpha */
    struct lr_schedule c = {.kind = LRS_COSINE, .initial = 0.01f, .decay_steps = 580, .alpha = 0.1f};
    near(lrs_value(&c, 580), 0.001f, 1e-9f, "alpha: the floor", 580);
    for (uint64_t step = 0; step <= 700; step++)
        near(lrs_value(&c, step), keras_cosine(0.01f, 580, 0.1f, 0, 0, 0, step), 0.01f * 1e-6f, "CosineDecay", step);
    /* the example's recipe: warm-up over epoch 1 (58 steps) to 0.01, cosine over the other 9 */
    struct lr_schedule r = {.kind = LRS_COSINE, .initial = 0.0f, .decay_steps = 522, .has_warmup = 1,
                            .warmup_target = 0.01f, .warmup_steps = 58};
    for (uint64_t step = 0; step <= 580; step++)
        near(lrs_value(&r, step), keras_cosine(0.0f, 522, 0, 1, 0.01f, 58, step), 0.01f * 1e-6f, "recipe", step);
}

Test(lrsched, bad_schedules_are_named)
{
    char why[200];
    struct lr_schedule s = {.kind = LRS_EXPONENTIAL, .initial = 0.1f, .decay_steps = 0, .decay_rate = 0.9f};
    cr_assert_eq(lrs_check(&s, why, sizeof why), -1);
    cr_assert(strstr(why, "decay_steps 0 must be > 0"), "%s", why);
    s.decay_steps = 10, s.decay_rate = NAN;
    cr_assert_eq(lrs_check(&s, why, sizeof why), -1);
    cr_assert(strstr(why, "decay_rate"), "%s", why);
    struct lr_schedule p = {.kind = LRS_PIECEWISE, .nbounds = 2, .bounds = {5, 5}, .values = {1, 2, 3}};
    cr_assert_eq(lrs_check(&p, why, sizeof why), -1);
    cr_assert(strstr(why, "increase strictly"), "%s", why);
    p.nbounds = 0;
    cr_assert_eq(lrs_check(&p, why, sizeof why), -1);
    cr_assert(strstr(why, "0 boundaries"), "%s", why);
    struct lr_schedule c = {.kind = LRS_COSINE, .initial = 0.1f, .decay_steps = 10, .alpha = 2};
    cr_assert_eq(lrs_check(&c, why, sizeof why), -1);
    cr_assert(strstr(why, "alpha 2 is outside [0, 1]"), "%s", why);
    c.alpha = 0, c.warmup_steps = 5;
    cr_assert_eq(lrs_check(&c, why, sizeof why), -1);
    cr_assert(strstr(why, "warmup_target"), "%s", why);
    struct lr_schedule k = {.kind = (enum lrs_kind)9};
    cr_assert_eq(lrs_check(&k, why, sizeof why), -1);
    cr_assert(strstr(why, "schedule 9"), "%s", why);
}

/* |got - want| in units of the last place of want (double) */
static double ulps(double got, double want)
{
    return fabs(got - want) / (nextafter(fabs(want), INFINITY) - fabs(want));
}

Test(detmath, close_to_libm)
{
    /* exp and log over the ranges softmax, cross-entropy and the schedules use */
    for (double x = -80.0; x <= 80.0; x += 0.01171875 + 1e-7)
        cr_assert(ulps(det_exp(x), exp(x)) <= 2.0, "exp(%.17g): %.17g, libm %.17g", x, det_exp(x), exp(x));
    for (double x = 1e-30; x <= 1e30; x *= 1.37)
        cr_assert(ulps(det_log(x), log(x)) <= 2.0 || fabs(det_log(x) - log(x)) < 1e-15, "log(%.17g): %.17g, libm %.17g",
                  x, det_log(x), log(x));
    for (double x = 0.0; x <= 4.0; x += 0.001)
        cr_assert(fabs(det_cos(x) - cos(x)) <= 4e-16, "cos(%.17g): %.17g, libm %.17g", x, det_cos(x), cos(x));
    /* exp(p log b): log's last-bit error grows with p log b (here up to 7),
     * still 2^24 times finer than the float the schedules round to */
    for (double p = 0.0; p <= 20.0; p += 0.0173)
        cr_assert(ulps(det_pow(0.7, p), pow(0.7, p)) <= 32.0, "pow(0.7, %.17g): %.17g, libm %.17g", p,
                  det_pow(0.7, p), pow(0.7, p));
    for (double x = -10.0; x <= 10.0; x += 0.00377)
        cr_assert(fabs(det_tanh(x) - tanh(x)) <= 4e-16 + 4e-16 * fabs(tanh(x)), "tanh(%.17g)", x);
    /* the float versions: within one float ulp of libm's */
    for (float x = -87.0f; x <= 87.0f; x += 0.0137f) {
        float a = det_expf(x), b = expf(x);
        cr_assert(a == b || nextafterf(a, b) == b, "expf(%.9g): %.9g, libm %.9g", (double)x, (double)a, (double)b);
    }
    for (float x = 1e-7f; x <= 1.0f; x *= 1.01f) {
        float a = det_logf(x), b = logf(x);
        cr_assert(a == b || nextafterf(a, b) == b, "logf(%.9g): %.9g, libm %.9g", (double)x, (double)a, (double)b);
    }
    /* special values (C99 Annex F) */
    cr_assert_eq(det_exp(-INFINITY), 0.0);
    cr_assert(isinf(det_exp(INFINITY)) && det_exp(INFINITY) > 0);
    cr_assert(isinf(det_exp(1000.0)));
    cr_assert_eq(det_exp(-1000.0), 0.0);
    cr_assert(isnan(det_exp(NAN)));
    cr_assert(isinf(det_log(0.0)) && det_log(0.0) < 0);
    cr_assert(isnan(det_log(-1.0)));
    cr_assert(isnan(det_logf(NAN)));
    cr_assert_eq(det_tanhf(-30.0f), -1.0f);
    cr_assert_eq(det_exp(0.0), 1.0);
    cr_assert_eq(det_log(1.0), 0.0);
}
