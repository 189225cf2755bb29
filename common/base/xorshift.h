/* xorshift32: a fixed integer recipe, so that the same seed draws the same
 * numbers on every machine (tpuctl's scenario picks, the worker's link
 * losses from a scenario's seed). *x is the state; 0 is taken as a fixed
 * non-zero start. */
#ifndef TPUEMU_XORSHIFT_H
#define TPUEMU_XORSHIFT_H

#include <stdint.h>

static inline uint32_t xorshift32(uint32_t *x)
{
    uint32_t v = *x ? *x : 0x9e3779b9u;
    v ^= v << 13;
    v ^= v >> 17;
    v ^= v << 5;
    return *x = v;
}

#endif
