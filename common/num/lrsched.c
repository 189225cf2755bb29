/* Learning-rate schedules (contract in lrsched.h). */
#include "lrsched.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "detmath.h"

#define PI 3.14159265358979323846

const char *lrs_name(enum lrs_kind k)
{
    switch (k) {
    case LRS_CONSTANT:
        return "constant";
    case LRS_EXPONENTIAL:
        return "ExponentialDecay";
    case LRS_PIECEWISE:
        return "PiecewiseConstantDecay";
    case LRS_COSINE:
        return "CosineDecay";
    }
    return "unknown";
}

static double cosine(double from, double s, double steps, double alpha)
{
    double c = 0.5 * (1.0 + det_cos(PI * (s / steps)));
    return from * ((1.0 - alpha) * c + alpha);
}

float lrs_value(const struct lr_schedule *s, uint64_t step)
{
    double t = (double)step, r;

    switch (s->kind) {
    case LRS_EXPONENTIAL: {
        double p = t / (double)s->decay_steps;
        if (s->staircase)
            p = floor(p);
        r = (double)s->initial * det_pow((double)s->decay_rate, p);
        break;
    }
    case LRS_PIECEWISE: {
        size_t i = 0;
        while (i < s->nbounds && step > s->bounds[i])
            i++;
        return s->values[i];
    }
    case LRS_COSINE: {
        double d = (double)s->decay_steps, w = (double)s->warmup_steps;
        if (!s->has_warmup) {
            r = cosine(s->initial, t < d ? t : d, d, s->alpha);
            break;
        }
        if (t > w + d)
            t = w + d;
        if (t < w)
            r = ((double)s->warmup_target - (double)s->initial) * (t / w) + (double)s->initial;
        else
            r = cosine(s->warmup_target, t - w, d, s->alpha);
        break;
    }
    default:
        return s->initial;
    }
    return (float)r;
}

__attribute__((format(printf, 3, 4))) static int bad(char *why, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (why && n)
        vsnprintf(why, n, fmt, ap);
    va_end(ap);
    return -1;
}

static int finite_nonneg(float v)
{
    return isfinite(v) && v >= 0.0f;
}

int lrs_check(const struct lr_schedule *s, char *why, size_t n)
{
    switch (s->kind) {
    case LRS_CONSTANT:
        return 0;
    case LRS_EXPONENTIAL:
        if (!finite_nonneg(s->initial))
            return bad(why, n, "ExponentialDecay: initial_learning_rate %g is not a finite number >= 0",
                       (double)s->initial);
        if (s->decay_steps == 0)
            return bad(why, n, "ExponentialDecay: decay_steps %d must be > 0", 0);
        if (!(isfinite(s->decay_rate) && s->decay_rate > 0.0f))
            return bad(why, n, "ExponentialDecay: decay_rate %g is not a finite number > 0", (double)s->decay_rate);
        return 0;
    case LRS_PIECEWISE:
        if (s->nbounds < 1 || s->nbounds > LRS_MAX_BOUNDARIES)
            return bad(why, n, "PiecewiseConstantDecay: %zu boundaries; give 1 to %d (and one value more)",
                       s->nbounds, LRS_MAX_BOUNDARIES);
        for (size_t i = 1; i < s->nbounds; i++)
            if (s->bounds[i] <= s->bounds[i - 1])
                return bad(why, n, "PiecewiseConstantDecay: boundaries must increase strictly (boundary %zu, %llu, is "
                                   "not above the one before)", i, (unsigned long long)s->bounds[i]);
        for (size_t i = 0; i <= s->nbounds; i++)
            if (!finite_nonneg(s->values[i]))
                return bad(why, n, "PiecewiseConstantDecay: value %zu (%g) is not a finite number >= 0", i,
                           (double)s->values[i]);
        return 0;
    case LRS_COSINE:
        if (!finite_nonneg(s->initial))
            return bad(why, n, "CosineDecay: initial_learning_rate %g is not a finite number >= 0",
                       (double)s->initial);
        if (s->decay_steps == 0)
            return bad(why, n, "CosineDecay: decay_steps %d must be > 0", 0);
        if (!(s->alpha >= 0.0f && s->alpha <= 1.0f))
            return bad(why, n, "CosineDecay: alpha %g is outside [0, 1]", (double)s->alpha);
        if (s->has_warmup && !finite_nonneg(s->warmup_target))
            return bad(why, n, "CosineDecay: warmup_target %g is not a finite number >= 0",
                       (double)s->warmup_target);
        if (s->warmup_steps && !s->has_warmup)
            return bad(why, n, "CosineDecay: warmup_steps %llu without a warmup_target (Keras ignores them; give "
                               "both)", (unsigned long long)s->warmup_steps);
        return 0;
    }
    return bad(why, n, "learning-rate schedule %d is not constant (0), ExponentialDecay (1), "
                       "PiecewiseConstantDecay (2) or CosineDecay (3)", (int)s->kind);
}
