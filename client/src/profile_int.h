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

#endif
