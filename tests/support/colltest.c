/* Collective-test helpers (see colltest.h): clusters with a system, inputs,
 * references. */
#include "colltest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "bf16.h"

static colltest *start(int hosts, const int *cores, const char *const *worker_args, int heartbeat_ms, int token)
{
    colltest *t = calloc(1, sizeof *t);
    cluster_opts o;
    int total = 0;
    memset(&o, 0, sizeof o);
    o.token = token;
    o.worker_args = worker_args;
    o.heartbeat_ms = heartbeat_ms;
    o.no_wait = 1;
    t->cl = cluster_start(&o);
    for (int h = 0; h < hosts; h++)
        for (int k = 0; k < cores[h]; k++) {
            char host[16];
            snprintf(host, sizeof host, "h%d", h);
            cluster_add_worker(t->cl, host, k, NULL);
            total++;
        }
    cr_assert(cluster_wait_count(t->cl, CL_ALIVE, total, 15000 + 300 * total),
              "only %d of %d workers registered", cluster_count(t->cl, CL_ALIVE), total);
    cr_assert_eq(cluster_connect(t->cl, &t->r, &t->c), TPU_OK, "connect: %s", tpu_last_error());
    ct_reinit(t);
    cr_assert_eq(t->n, total, "the system has %d replicas, %d workers run", t->n, total);
    return t;
}

colltest *ct_start(int hosts, const int *cores, const char *const *worker_args, int heartbeat_ms)
{
    return start(hosts, cores, worker_args, heartbeat_ms, 0);
}

colltest *ct_start_token(int hosts, const int *cores, int heartbeat_ms)
{
    return start(hosts, cores, NULL, heartbeat_ms, 1);
}

void ct_reinit(colltest *t)
{
    tpu_topology *tp = NULL;
    int alive = cluster_count(t->cl, CL_ALIVE);
    tpu_init_options io = {.expect = (uint32_t)(alive > 0 ? alive : 0), .timeout_ms = 15000, .allow_partial = 0}; /* the dead are known but not expected */
    cr_assert_eq(tpu_initialize_system(t->c, &io, &tp), TPU_OK, "initialize: %s", tpu_last_error());
    t->n = tpu_topology_num_replicas(tp);
    cr_assert_eq(tpu_cluster_num_replicas(t->c), t->n);
    cr_assert_leq(t->n, CL_MAX_WORKERS);
    for (int r = 0; r < t->n; r++) {
        tpu_topology_core tc;
        cr_assert_eq(tpu_topology_core_get(tp, r, &tc), TPU_OK);
        snprintf(t->name[r], sizeof t->name[r], "%s/%d", tc.host_id, tc.core);
        t->worker_of[r] = -1;
        for (int i = 0; i < t->cl->nworkers; i++)
            if (strcmp(t->cl->workers[i].host, tc.host_id) == 0 && t->cl->workers[i].core == tc.core)
                t->worker_of[r] = i;
    }
    tpu_topology_free(tp);
}

void ct_free(colltest *t)
{
    if (!t)
        return;
    tpu_cluster_free(t->c);
    tpu_resolver_free(t->r);
    cluster_free(t->cl);
    free(t);
}

static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

float ct_value(int seed, int r, size_t i, int range)
{
    uint32_t h = mix((uint32_t)i * 2654435761u ^ mix((uint32_t)r * 40503u + (uint32_t)seed * 97u + 1u));
    double v = (double)(h >> 8) / (double)(1u << 24) * 2.0 - 1.0;
    if (range > 0)
        v = ldexp(v, (int)(mix(h) % (uint32_t)(2 * range + 1)) - range);
    return (float)v;
}

void **ct_alloc(int n, size_t bytes)
{
    void **b = calloc((size_t)n, sizeof *b);
    for (int r = 0; r < n; r++) {
        b[r] = calloc(1, bytes ? bytes : 1);
        cr_assert_not_null(b[r]);
    }
    return b;
}

void **ct_bufs(int n, size_t count, tpu_dtype dt, int seed, int range, int zero_from)
{
    size_t es = tpu_dtype_size(dt);
    void **b = ct_alloc(n, count * es);
    for (int r = 0; r < n && r < zero_from; r++)
        for (size_t i = 0; i < count; i++) {
            float f = ct_value(seed, r, i, range);
            if (dt == TPU_BF16)
                ((uint16_t *)b[r])[i] = bf16_from_f32(f);
            else
                ((float *)b[r])[i] = f;
        }
    return b;
}

void ct_free_bufs(void **b, int n)
{
    for (int r = 0; b && r < n; r++)
        free(b[r]);
    free(b);
}

double ct_get(const void *buf, tpu_dtype dt, size_t i)
{
    return dt == TPU_BF16 ? bf16_to_f32(((const uint16_t *)buf)[i]) : ((const float *)buf)[i];
}

static double input(int seed, int r, size_t i, int range, tpu_dtype dt)
{
    float f = ct_value(seed, r, i, range);
    return dt == TPU_BF16 ? bf16_to_f32(bf16_from_f32(f)) : f;
}

int ct_check_reduce(const void *out, size_t count, size_t first, tpu_dtype dt, tpu_reduce_op op, int seed,
                    int range, const int *members, int m, char *why, size_t whylen)
{
    return ct_check_reduce_abs(out, count, first, dt, op, seed, range, members, m, 0, why, whylen);
}

int ct_check_reduce_abs(const void *out, size_t count, size_t first, tpu_dtype dt, tpu_reduce_op op, int seed,
                        int range, const int *members, int m, double abs_extra, char *why, size_t whylen)
{
    for (size_t i = 0; i < count; i++) {
        double ref = 0, mag = 0, tol, got;
        for (int k = 0; k < m; k++) {
            double x = input(seed, members[k], first + i, range, dt);
            if (k == 0)
                ref = x;
            else if (op == TPU_SUM || op == TPU_MEAN)
                ref += x;
            else if (op == TPU_MAX)
                ref = x > ref ? x : ref;
            else
                ref = x < ref ? x : ref;
            mag += fabs(x);
        }
        if (op == TPU_MEAN) {
            ref /= m;
            mag /= m;
        }
        if (op == TPU_MAX || op == TPU_MIN)
            tol = 0;
        else
            tol = (m - 1) * ldexp(mag, -24) + ldexp(fabs(ref), -24) + (dt == TPU_BF16 ? ldexp(fabs(ref), -8) : 0) +
                  abs_extra;
        got = ct_get(out, dt, i);
        if (!(fabs(got - ref) <= tol)) {
            snprintf(why, whylen, "element %zu: got %.9g, float64 reference %.9g, tolerance %.3g (%s %s over %d replicas)",
                     first + i, got, ref, tol, tpu_dtype_name(dt), tpu_reduce_op_name(op), m);
            return 0;
        }
    }
    return 1;
}

int ct_same(void *const *bufs, int n, size_t bytes, const int *members, int m)
{
    if (!members) {
        for (int r = 1; r < n; r++)
            if (memcmp(bufs[r], bufs[0], bytes) != 0)
                return 0;
        return 1;
    }
    for (int k = 1; k < m; k++)
        if (memcmp(bufs[members[k]], bufs[members[0]], bytes) != 0)
            return 0;
    return 1;
}
