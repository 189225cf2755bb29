/* Learning-rate schedules, as tf.keras.optimizers.schedules computes them
 * (keras/src/optimizers/schedules/learning_rate_schedule.py), evaluated at
 * the optimizer's iteration count before the update (Keras' optimizer calls
 * learning_rate(self.iterations) and then increments iterations):
 *
 *   ExponentialDecay:       lr0 * rate^(step / decay_steps)   (staircase: floor of the quotient)
 *   PiecewiseConstantDecay: values[0] while step <= boundaries[0], values[i] while
 *                           boundaries[i-1] < step <= boundaries[i], values[n] after boundaries[n-1]
 *   CosineDecay:            without warmup_target: s = min(step, decay_steps),
 *                           lr0 * ((1 - alpha) * 0.5 * (1 + cos(pi s / decay_steps)) + alpha);
 *                           with it (TF 2.13+): s = min(step, warmup_steps + decay_steps);
 *                           s < warmup_steps: lr0 + (warmup_target - lr0) * s / warmup_steps,
 *                           else the decay above from warmup_target at s - warmup_steps.
 *
 * Computed in double with detmath's pow and cos, so a schedule gives the same
 * bits on every host; the result is rounded to float as Keras' float32
 * schedule is. Pure and thread-safe. */
#ifndef TPUEMU_COMMON_LRSCHED_H
#define TPUEMU_COMMON_LRSCHED_H

#include <stddef.h>
#include <stdint.h>

#define LRS_MAX_BOUNDARIES 16

enum lrs_kind { LRS_CONSTANT = 0, LRS_EXPONENTIAL = 1, LRS_PIECEWISE = 2, LRS_COSINE = 3 };

struct lr_schedule {
    enum lrs_kind kind;
    float initial;        /* initial_learning_rate (exponential, cosine) */
    uint64_t decay_steps; /* exponential, cosine: > 0 */
    float decay_rate;     /* exponential: > 0 */
    int staircase;        /* exponential */
    float alpha;          /* cosine: in [0, 1] */
    int has_warmup;       /* cosine: warmup_target given */
    float warmup_target;  /* cosine */
    uint64_t warmup_steps;/* cosine */
    size_t nbounds;       /* piecewise: 1..LRS_MAX_BOUNDARIES */
    uint64_t bounds[LRS_MAX_BOUNDARIES];       /* strictly increasing */
    float values[LRS_MAX_BOUNDARIES + 1];      /* nbounds + 1 of them */
};

/* The learning rate at optimizer step `step` (0 for the first update). */
float lrs_value(const struct lr_schedule *s, uint64_t step);

/* 0 if s is well formed; else -1 with a message naming the bad field
 * ("decay_steps 0 must be > 0") in why. */
int lrs_check(const struct lr_schedule *s, char *why, size_t n);

/* "ExponentialDecay", "PiecewiseConstantDecay", "CosineDecay", "constant". */
const char *lrs_name(enum lrs_kind k);

#endif
