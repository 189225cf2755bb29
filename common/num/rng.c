/* The shuffles' generator (rng.h). */
#include "rng.h"

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t rng_next(uint64_t s[4])
{
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

void rng_seed(uint64_t s[4], uint64_t seed, uint64_t epoch, uint64_t stage)
{
    uint64_t a = seed, b = epoch ^ 0x632be59bd9b4e019u, c = stage;
    uint64_t st = splitmix64(&a) ^ rotl(splitmix64(&b), 21) ^ rotl(splitmix64(&c), 42);
    for (int i = 0; i < 4; i++)
        s[i] = splitmix64(&st);
}

uint64_t rng_below(uint64_t s[4], uint64_t n)
{
    uint64_t lim = (0 - n) % n, r;
    do
        r = rng_next(s);
    while (r < lim);
    return r % n;
}
