/* The shuffles' generator: splitmix64 seeding xoshiro256**. Both are fixed
 * integer recipes, so a (seed, epoch, stage) gives the same sequence on every
 * machine: the client's datasets and the hosts' input pipelines shuffle with
 * it, and the same pipeline gives the same order in either place. */
#ifndef TPUEMU_NUM_RNG_H
#define TPUEMU_NUM_RNG_H

#include <stdint.h>

/* s from the seed, the epoch and the stage of the pipeline that shuffles. */
void rng_seed(uint64_t s[4], uint64_t seed, uint64_t epoch, uint64_t stage);
uint64_t rng_next(uint64_t s[4]);
/* Uniform in [0, n), n >= 1, without modulo bias. */
uint64_t rng_below(uint64_t s[4], uint64_t n);

#endif
