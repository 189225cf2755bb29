/* What the fit callback needs of the profiler beyond tpuemu/profile.h. Never
 * installed. */
#ifndef TPUEMU_CLIENT_PROFILE_INT_H
#define TPUEMU_CLIENT_PROFILE_INT_H

#include <stdint.h>

#include "tpuemu/profile.h"

/* Keeps only what happened from the start of global step first to the end
 * of step last (on any core), of the steps that began after since_ns (our
 * CLOCK_MONOTONIC: a model's steps count from 1, an earlier run's are still
 * in the rings); the capture's span becomes that window. */
void profile_keep_steps(tpu_profile *p, uint64_t first, uint64_t last, int64_t since_ns);

/* One step of one core: when it began (the end of the core's previous step,
 * ms after the capture's start) and its period's parts in ms, indexed by
 * TPU_PROFILE_INPUT..TPU_PROFILE_IDLE. has_period is 0 for a step whose
 * previous step is not in the capture: its idle part is then unknown (0) and
 * start_ms is its own first event. */
struct profile_step {
    uint64_t step;
    double start_ms;
    double part_ms[5];
    int has_period;
};
/* Core i's steps in step order, in a malloc'd array the caller frees; 0 with
 * *out NULL when the core trained no step in the capture (or on ENOMEM). */
size_t profile_core_steps(const tpu_profile *p, size_t i, struct profile_step **out);

#endif
