/* Helpers for the collectives' integration tests: a cluster with an
 * initialized system and a client handle on it, known inputs, float64
 * references with stated tolerances, and bitwise comparisons across replicas.
 *
 * Tolerances (why): inputs are floats with at most 24 significant bits, so a
 * float64 sum of up to 64 of them is exact; the cores add them in float32 in
 * some order, each addition rounding by at most 2^-24 of the running sum's
 * magnitude, so |result - ref| <= (n-1) 2^-24 sum|x| (MEAN adds one more
 * rounding: + 2^-24 |ref|). bf16 accumulates in float32 the same way and
 * rounds once to bf16 at the end: + 2^-8 |ref| (half an ulp of an 8-bit
 * significand is 2^-8 relative at worst). MAX, MIN, broadcast and all-gather
 * move or pick values: exact. */
#ifndef TPUEMU_TESTS_COLLTEST_H
#define TPUEMU_TESTS_COLLTEST_H

#include <stddef.h>
#include <stdint.h>

#include "cluster.h"

typedef struct colltest {
    cluster *cl;
    tpu_resolver *r;
    tpu_cluster *c;
    int n; /* replicas of the initialized system */
    int worker_of[CL_MAX_WORKERS];  /* replica -> index in cl->workers */
    char name[CL_MAX_WORKERS][72];  /* replica -> "h1/0" */
} colltest;

/* Starts a cluster (per host: cores[h] workers on host "h<h>", hosts entries),
 * with extra worker args (NULL-terminated or NULL) and heartbeat settings (0:
 * the fixture's 100 ms x 3), connects and initializes. Fails the test on error. */
colltest *ct_start(int hosts, const int *cores, const char *const *worker_args, int heartbeat_ms);
/* Same, the cluster with a token (CL_TOKEN in t->cl->token_file), which the
 * client handle carries. */
colltest *ct_start_token(int hosts, const int *cores, int heartbeat_ms);
void ct_free(colltest *t);
/* Initializes again (a new epoch) with every alive core; n, worker_of and
 * name updated. */
void ct_reinit(colltest *t);

/* Input element i of replica r for a seed: a float in [-1, 1) with at most 24
 * significant bits, scaled by 2^e with e in [-range, range] (range 0: none). */
float ct_value(int seed, int r, size_t i, int range);
/* Allocates n buffers of count elements of dtype and fills them with ct_value
 * (bf16: rounded to bf16). zero_from: replicas >= it get zeros (n: none). */
void **ct_bufs(int n, size_t count, tpu_dtype dt, int seed, int range, int zero_from);
void **ct_alloc(int n, size_t bytes);
void ct_free_bufs(void **b, int n);
/* Value of element i of a buffer as a double. */
double ct_get(const void *buf, tpu_dtype dt, size_t i);

/* Checks out (count elements, on replica r) against the reduction over the
 * replicas in members[0..m-1] of ct_value(seed, member, first + i) with the
 * tolerance above. Returns 1 if all within; else 0 and describes the first bad
 * element in why. */
int ct_check_reduce(const void *out, size_t count, size_t first, tpu_dtype dt, tpu_reduce_op op,
                    int seed, int range, const int *members, int m, char *why, size_t whylen);
/* The same with an extra absolute tolerance (reproducible mode: each term is
 * truncated to a fixed-point grid set by the largest magnitude, see
 * it_collectives.c). */
int ct_check_reduce_abs(const void *out, size_t count, size_t first, tpu_dtype dt, tpu_reduce_op op,
                        int seed, int range, const int *members, int m, double abs_extra, char *why,
                        size_t whylen);
/* 1 if every replica's buffer (bytes each) is bitwise the same as replica 0's,
 * among members (NULL: all n). */
int ct_same(void *const *bufs, int n, size_t bytes, const int *members, int m);

#endif
