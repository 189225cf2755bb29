/* Collectives end to end through real workers and libtpuclient: every kind,
 * op, dtype and algorithm against float64 references (tolerances stated and
 * justified in tests/support/colltest.h), for 1, 2, 3, 4, 5 and 8 cores
 * (non-powers of two included) and counts 0, 1, n-1, odd, > 1 MiB; bitwise
 * identical across replicas and run to run; reproducible mode bitwise equal
 * across algorithms, chunk sizes and core counts; replica groups; broadcast
 * from every root; TCP (several host ids, or --transport tcp) and shared
 * memory (one host id); the CLI's bench. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "calls.h"
#include "colltest.h"

/* These tests check results, not fault detection (it_faults does): beat every
 * 500 ms so that a core starved of CPU on a loaded two-core machine (the
 * sanitizer run starts dozens of workers) is not taken for a hung one. */
#define HEARTBEAT_MS 500

static const tpu_algo ALGOS[] = {TPU_ALGO_AUTO, TPU_ALGO_RING, TPU_ALGO_HD, TPU_ALGO_HIER};
static const tpu_reduce_op OPS[] = {TPU_SUM, TPU_MEAN, TPU_MAX, TPU_MIN};
static const tpu_dtype DTYPES[] = {TPU_F32, TPU_BF16};


/* One all-reduce of (count, dtype, op, algo) on every replica, checked. */
static void allreduce_checked(colltest *t, size_t count, tpu_dtype dt, tpu_reduce_op op, tpu_algo algo, int seed)
{
    int members[64];
    void **b = ct_bufs(t->n, count, dt, seed, 0, t->n);
    tpu_collective_options o = {.algo = algo};
    char why[512];
    for (int r = 0; r < t->n; r++)
        members[r] = r;
    tpu_status st = tpu_all_reduce(t->c, b, count, dt, op, &o);
    cr_assert_eq(st, TPU_OK, "all-reduce n=%d count=%zu %s %s algo %s: %s: %s", t->n, count, tpu_dtype_name(dt),
                 tpu_reduce_op_name(op), tpu_algo_name(algo), tpu_status_name(st), tpu_last_error());
    for (int r = 0; r < t->n; r++)
        cr_assert(ct_check_reduce(b[r], count, 0, dt, op, seed, 0, members, t->n, why, sizeof why),
                  "all-reduce n=%d count=%zu algo %s, replica %d: %s", t->n, count, tpu_algo_name(algo), r, why);
    cr_assert(ct_same(b, t->n, count * tpu_dtype_size(dt), NULL, 0),
              "all-reduce n=%d count=%zu %s %s algo %s: replicas differ bitwise", t->n, count,
              tpu_dtype_name(dt), tpu_reduce_op_name(op), tpu_algo_name(algo));
    ct_free_bufs(b, t->n);
}

/* The whole matrix on one system: small counts for every combination, and
 * a > 1 MiB odd count for SUM with each algorithm and dtype. */
static void matrix(int hosts, const int *cores)
{
    colltest *t = ct_start(hosts, cores, NULL, HEARTBEAT_MS);
    size_t counts[] = {0, 1, (size_t)(t->n > 1 ? t->n - 1 : 2), 7, 1025};
    int seed = 1;
    for (size_t a = 0; a < 4; a++)
        for (size_t d = 0; d < 2; d++) {
            for (size_t k = 0; k < 4; k++)
                for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
                    allreduce_checked(t, counts[c], DTYPES[d], OPS[k], ALGOS[a], seed++);
            allreduce_checked(t, 300007, DTYPES[d], TPU_SUM, ALGOS[a], seed++); /* 1.2 MB in f32 */
        }
    ct_free(t);
}

Test(allreduce, n1, .timeout = 120)
{
    matrix(1, (int[]){1});
}

Test(allreduce, n2_two_hosts, .timeout = 120)
{
    matrix(2, (int[]){1, 1});
}

Test(allreduce, n3_one_host, .timeout = 120)
{
    matrix(1, (int[]){3});
}

Test(allreduce, n4_two_hosts, .timeout = 150)
{
    matrix(2, (int[]){2, 2});
}

Test(allreduce, n5_uneven_hosts, .timeout = 150)
{
    matrix(2, (int[]){3, 2});
}

Test(allreduce, n8_two_hosts, .timeout = 200)
{
    matrix(2, (int[]){4, 4});
}

/* The direct intra-host all-reduce (server/worker/coll/direct.c): 3 and 4
 * cores of one host id reduce through their host segments with the automatic
 * choice, and the cores report it ("direct" over "shm"; 2 cores keep hd, one
 * exchange through the ring, with the same checks); every op and dtype,
 * odd counts (0, 1, n-1, 7, 1025, 100003: 400 KB), checked against the
 * float64 reference and bitwise the same on every replica and run after run:
 * the same reduced tensor everywhere, as tf.tpu.cross_replica_sum gives
 * (tensorflow/python/tpu/ops/tpu_ops.py: "Sum the input tensor across
 * replicas according to group_assignment"). A buffer larger than the
 * segments (TPUEMU_COLL_SHM_MAX, 1 MiB of float32 by default) takes the
 * rings. */
Test(allreduce, direct_on_one_host_n2_n3_n4, .timeout = 240)
{
    const size_t counts[] = {0, 1, 2, 7, 1025, 100003};
    tpu_collective_stats st;
    int seed = 300;
    for (int n = 2; n <= 4; n++) {
        colltest *t = ct_start(1, (int[]){n}, NULL, HEARTBEAT_MS);
        for (size_t d = 0; d < 2; d++)
            for (size_t k = 0; k < 4; k++)
                for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
                    size_t count = counts[c] == 2 ? (size_t)n - 1 : counts[c];
                    allreduce_checked(t, count, DTYPES[d], OPS[k], TPU_ALGO_AUTO, seed++);
                    CALL_OK(tpu_last_collective(t->c, &st));
                    cr_assert_str_eq(st.algorithm, n >= 3 ? "direct" : "hd", "n=%d count=%zu %s %s: algorithm '%s'",
                                     n, count, tpu_dtype_name(DTYPES[d]), tpu_reduce_op_name(OPS[k]), st.algorithm);
                    if (count || n >= 3) /* an empty hd moves nothing: no link to name */
                        cr_assert_str_eq(st.transport, "shm", "n=%d count=%zu: transport '%s'", n, count,
                                         st.transport);
                }
        /* fractional inputs: the order matters, the bits do not change */
        void **a = ct_bufs(t->n, 30011, TPU_F32, 9, 20, t->n), **b = ct_bufs(t->n, 30011, TPU_F32, 9, 20, t->n);
        CALL_OK(tpu_all_reduce(t->c, a, 30011, TPU_F32, TPU_SUM, NULL));
        CALL_OK(tpu_all_reduce(t->c, b, 30011, TPU_F32, TPU_SUM, NULL));
        cr_assert(ct_same(a, t->n, 30011 * 4, NULL, 0), "n=%d: replicas differ bitwise", n);
        for (int r = 0; r < t->n; r++)
            cr_assert(memcmp(a[r], b[r], 30011 * 4) == 0, "n=%d: replica %d differs between two runs", n, r);
        ct_free_bufs(a, t->n);
        ct_free_bufs(b, t->n);
        allreduce_checked(t, 300007, TPU_F32, TPU_SUM, TPU_ALGO_AUTO, seed++); /* 1.2 MB */
        CALL_OK(tpu_last_collective(t->c, &st));
        cr_assert_str_neq(st.algorithm, "direct", "n=%d: 1.2 MB does not fit the 1 MiB segments", n);
        ct_free(t);
    }
}

/* TPUEMU_COLL_SHM_DIRECT=0 in the workers' environment: no host segments, the
 * cores agree on the rings (hd below 2 MiB on 4 cores) with the same results. */
Test(allreduce, direct_turned_off_by_the_environment, .timeout = 120)
{
    tpu_collective_stats st;
    setenv("TPUEMU_COLL_SHM_DIRECT", "0", 1);
    colltest *t = ct_start(1, (int[]){4}, NULL, HEARTBEAT_MS);
    for (size_t k = 0; k < 4; k++) {
        allreduce_checked(t, 1025, TPU_F32, OPS[k], TPU_ALGO_AUTO, 77);
        CALL_OK(tpu_last_collective(t->c, &st));
        cr_assert_str_eq(st.algorithm, "hd", "direct path off: algorithm '%s'", st.algorithm);
        cr_assert_str_eq(st.transport, "shm", "transport '%s'", st.transport);
    }
    ct_free(t);
}

/* Same inputs, same algorithm: bitwise the same outputs, call after call. */
Test(allreduce, identical_run_to_run, .timeout = 120)
{
    colltest *t = ct_start(2, (int[]){3, 2}, NULL, HEARTBEAT_MS);
    size_t count = 100003;
    for (size_t a = 0; a < 4; a++) {
        void **first = ct_bufs(t->n, count, TPU_F32, 7, 20, t->n);
        void **again = ct_bufs(t->n, count, TPU_F32, 7, 20, t->n);
        tpu_collective_options o = {.algo = ALGOS[a]};
        CALL_OK(tpu_all_reduce(t->c, first, count, TPU_F32, TPU_SUM, &o));
        CALL_OK(tpu_all_reduce(t->c, again, count, TPU_F32, TPU_SUM, &o));
        for (int r = 0; r < t->n; r++)
            cr_assert(memcmp(first[r], again[r], count * 4) == 0,
                      "algo %s: replica %d's result differs between two identical runs", tpu_algo_name(ALGOS[a]), r);
        ct_free_bufs(first, t->n);
        ct_free_bufs(again, t->n);
    }
    ct_free(t);
}

/* Reproducible SUM of inputs spanning 2^-30..2^30 (where float order matters):
 * one result, bitwise, whatever the algorithm, chunk size or core count. The
 * 8-core run has the same 5 non-zero terms as the 5-core run, plus 3 zeros. */
static void repro_sum(colltest *t, size_t count, tpu_algo algo, size_t chunk, int nonzero, void *out)
{
    void **b = ct_bufs(t->n, count, TPU_F32, 11, 30, nonzero);
    tpu_collective_options o = {.algo = algo, .reproducible = 1, .chunk_bytes = chunk};
    tpu_status st = tpu_all_reduce(t->c, b, count, TPU_F32, TPU_SUM, &o);
    cr_assert_eq(st, TPU_OK, "reproducible all-reduce n=%d algo %s chunk %zu: %s: %s", t->n, tpu_algo_name(algo),
                 chunk, tpu_status_name(st), tpu_last_error());
    cr_assert(ct_same(b, t->n, count * 4, NULL, 0), "reproducible mode: replicas differ bitwise");
    memcpy(out, b[0], count * 4);
    ct_free_bufs(b, t->n);
}

Test(reproducible, across_algorithms_chunks_and_core_counts, .timeout = 200)
{
    colltest *t = ct_start(2, (int[]){4, 4}, NULL, HEARTBEAT_MS);
    size_t count = 70001, chunks[] = {0, 4096, 65536};
    float *ref = malloc(count * 4), *got = malloc(count * 4);
    int members[5] = {0, 1, 2, 3, 4};
    char why[512];
    repro_sum(t, count, TPU_ALGO_RING, 0, 5, ref);
    /* Close to the float64 reference too. Reproducible mode sums fixed-point
     * integers on a grid set by the largest magnitude (of the buffer or a
     * block: at most the global max, 2^30 here) with headroom for up to 1024
     * terms, so each term loses less than max x 2^-50 (2 bits spare), then one
     * rounding to float32: tolerance = the normal one + 5 x max x 2^-50. */
    double maxabs = 0;
    for (int r = 0; r < 5; r++)
        for (size_t i = 0; i < count; i++)
            maxabs = fmax(maxabs, fabs(ct_value(11, r, i, 30)));
    cr_assert(ct_check_reduce_abs(ref, count, 0, TPU_F32, TPU_SUM, 11, 30, members, 5, 5 * ldexp(maxabs, -50), why,
                                  sizeof why),
              "reproducible sum vs float64: %s", why);
    for (size_t a = 0; a < 4; a++)
        for (size_t c = 0; c < 3; c++) {
            repro_sum(t, count, ALGOS[a], chunks[c], 5, got);
            cr_assert(memcmp(ref, got, count * 4) == 0,
                      "reproducible sum on 8 cores differs bitwise between ring and %s with chunk %zu",
                      tpu_algo_name(ALGOS[a]), chunks[c]);
        }
    /* now 5 cores: stop 3 workers (replicas 5..7 are on h1) and re-initialize */
    for (int i = 5; i < 8; i++)
        cluster_kill_worker(t->cl, i);
    cr_assert(cluster_wait_count(t->cl, CL_ALIVE, 5, 10000), "the killed workers were not declared dead");
    ct_reinit(t);
    cr_assert_eq(t->n, 5);
    for (size_t a = 0; a < 4; a++) {
        repro_sum(t, count, ALGOS[a], a == 3 ? 4096 : 0, 5, got);
        cr_assert(memcmp(ref, got, count * 4) == 0,
                  "reproducible sum differs bitwise between 8 cores (ring) and 5 cores (%s)", tpu_algo_name(ALGOS[a]));
    }
    free(ref);
    free(got);
    ct_free(t);
}

/* Interleaved and blocked groups reduce independently. */
Test(groups, allreduce_and_allgather, .timeout = 120)
{
    colltest *t = ct_start(2, (int[]){3, 3}, NULL, HEARTBEAT_MS);
    static const int interleaved[6] = {0, 1, 0, 1, 0, 1}, blocked[6] = {0, 0, 1, 1, 2, 2};
    const int *ga[2] = {interleaved, blocked};
    size_t count = 4099;
    char why[512];
    for (int gi = 0; gi < 2; gi++)
        for (size_t a = 0; a < 4; a++) {
            void **b = ct_bufs(t->n, count, TPU_F32, 21, 0, t->n);
            tpu_collective_options o = {.algo = ALGOS[a], .group_assignment = ga[gi]};
            CALL_OK(tpu_all_reduce(t->c, b, count, TPU_F32, TPU_SUM, &o));
            for (int r = 0; r < t->n; r++) {
                int members[6], m = 0;
                for (int q = 0; q < t->n; q++)
                    if (ga[gi][q] == ga[gi][r])
                        members[m++] = q;
                cr_assert(ct_check_reduce(b[r], count, 0, TPU_F32, TPU_SUM, 21, 0, members, m, why, sizeof why),
                          "groups %s algo %s replica %d: %s", gi ? "blocked" : "interleaved",
                          tpu_algo_name(ALGOS[a]), r, why);
                cr_assert(ct_same(b, t->n, count * 4, members, m), "a group's replicas differ bitwise");
            }
            ct_free_bufs(b, t->n);
        }
    /* all-gather in groups: each gets its group's inputs, in replica order */
    for (int gi = 0; gi < 2; gi++) {
        int g = gi ? 2 : 3;
        void **in = ct_bufs(t->n, count, TPU_F32, 22, 0, t->n);
        void **out = ct_alloc(t->n, count * 4 * (size_t)g);
        tpu_collective_options o = {.algo = TPU_ALGO_AUTO, .group_assignment = ga[gi]};
        CALL_OK(tpu_all_gather(t->c, (const void *const *)in, out, count, TPU_F32, &o));
        for (int r = 0; r < t->n; r++)
            for (int q = 0, k = 0; q < t->n; q++)
                if (ga[gi][q] == ga[gi][r]) {
                    cr_assert(memcmp((char *)out[r] + (size_t)k * count * 4, in[q], count * 4) == 0,
                              "all-gather groups %s: replica %d's block %d is not replica %d's input",
                              gi ? "blocked" : "interleaved", r, k, q);
                    k++;
                }
        ct_free_bufs(in, t->n);
        ct_free_bufs(out, t->n);
    }
    /* groups of different sizes are refused before anything is sent */
    {
        static const int bad[6] = {0, 0, 0, 1, 1, 2};
        void **b = ct_bufs(t->n, 4, TPU_F32, 1, 0, t->n);
        tpu_collective_options o = {.algo = TPU_ALGO_AUTO, .group_assignment = bad};
        cr_assert_eq(tpu_all_reduce(t->c, b, 4, TPU_F32, TPU_SUM, &o), TPU_INVALID_ARGUMENT);
        cr_assert(strstr(tpu_last_error(), "group"), "%s", tpu_last_error());
        ct_free_bufs(b, t->n);
    }
    ct_free(t);
}

Test(broadcast, from_every_root, .timeout = 120)
{
    colltest *t = ct_start(2, (int[]){3, 2}, NULL, HEARTBEAT_MS);
    size_t counts[] = {1, 1000, 300001};
    for (size_t d = 0; d < 2; d++)
        for (size_t c = 0; c < 3; c++)
            for (int root = 0; root < t->n; root++) {
                size_t bytes = counts[c] * tpu_dtype_size(DTYPES[d]);
                void **b = ct_bufs(t->n, counts[c], DTYPES[d], 31 + root, 0, t->n);
                void *want = malloc(bytes);
                memcpy(want, b[root], bytes);
                CALL_OK(tpu_broadcast(t->c, b, counts[c], DTYPES[d], root, NULL));
                for (int r = 0; r < t->n; r++)
                    cr_assert(memcmp(b[r], want, bytes) == 0, "broadcast %s count %zu from %d: replica %d differs",
                              tpu_dtype_name(DTYPES[d]), counts[c], root, r);
                free(want);
                ct_free_bufs(b, t->n);
            }
    ct_free(t);
}

static void gather_scatter(int hosts, const int *cores)
{
    colltest *t = ct_start(hosts, cores, NULL, HEARTBEAT_MS);
    size_t counts[] = {0, 1, (size_t)t->n - 1, 1001, 300007};
    int members[64];
    char why[512];
    for (int r = 0; r < t->n; r++)
        members[r] = r;
    for (size_t d = 0; d < 2; d++)
        for (size_t c = 0; c < 5; c++) {
            size_t count = counts[c], es = tpu_dtype_size(DTYPES[d]);
            void **in = ct_bufs(t->n, count, DTYPES[d], 41, 0, t->n);
            void **out = ct_alloc(t->n, count * es * (size_t)t->n);
            CALL_OK(tpu_all_gather(t->c, (const void *const *)in, out, count, DTYPES[d], NULL));
            for (int r = 0; r < t->n; r++)
                for (int q = 0; q < t->n; q++)
                    cr_assert(memcmp((char *)out[r] + (size_t)q * count * es, in[q], count * es) == 0,
                              "all-gather n=%d %s count %zu: replica %d's block %d is wrong", t->n,
                              tpu_dtype_name(DTYPES[d]), count, r, q);
            ct_free_bufs(out, t->n);
            for (size_t k = 0; k < 4; k++) {
                out = ct_alloc(t->n, count * es);
                cr_assert_eq(tpu_reduce_scatter(t->c, (const void *const *)in, out, count, DTYPES[d], OPS[k], NULL),
                             TPU_OK, "reduce-scatter: %s", tpu_last_error());
                for (int r = 0; r < t->n; r++) {
                    size_t first, cnt;
                    tpu_reduce_scatter_block(count, t->n, r, &first, &cnt);
                    cr_assert(ct_check_reduce(out[r], cnt, first, DTYPES[d], OPS[k], 41, 0, members, t->n, why,
                                              sizeof why),
                              "reduce-scatter n=%d count %zu %s %s replica %d: %s", t->n, count,
                              tpu_dtype_name(DTYPES[d]), tpu_reduce_op_name(OPS[k]), r, why);
                }
                ct_free_bufs(out, t->n);
            }
            ct_free_bufs(in, t->n);
        }
    ct_free(t);
}

Test(gather_scatter, n3, .timeout = 120)
{
    gather_scatter(1, (int[]){3});
}

Test(gather_scatter, n5, .timeout = 120)
{
    gather_scatter(2, (int[]){3, 2});
}

/* The transport the cores report: shared memory between cores of one host
 * id, TCP across host ids or with --transport tcp; the results agree. */
static void transport_case(int hosts, const int *cores, const char *const *args, const char *want)
{
    colltest *t = ct_start(hosts, cores, args, HEARTBEAT_MS);
    tpu_collective_stats st;
    for (size_t a = 0; a < 4; a++) {
        allreduce_checked(t, 262147, TPU_F32, TPU_SUM, ALGOS[a], 51);
        CALL_OK(tpu_last_collective(t->c, &st));
        cr_assert_str_eq(st.transport, want, "algo %s on %d host(s)%s: transport '%s' (algorithm '%s'), want '%s'",
                         tpu_algo_name(ALGOS[a]), hosts, args ? " with --transport tcp" : "", st.transport,
                         st.algorithm, want);
        cr_assert(st.time_ns > 0, "the cores reported no time");
        cr_assert_eq(st.time_p50_ns, 0, "one iteration has no median: %llu ns", (unsigned long long)st.time_p50_ns);
        cr_assert(st.algorithm[0], "the cores reported no algorithm");
    }
    ct_free(t);
}

Test(transport, shm_on_one_host, .timeout = 120)
{
    transport_case(1, (int[]){4}, NULL, "shm");
}

Test(transport, tcp_across_hosts, .timeout = 120)
{
    transport_case(4, (int[]){1, 1, 1, 1}, NULL, "tcp");
}

Test(transport, tcp_forced_on_one_host, .timeout = 120)
{
    static const char *const tcp[] = {"--transport", "tcp", NULL};
    transport_case(1, (int[]){4}, tcp, "tcp");
}

/* Someone else re-initializes: our next collective is refused, naming both epochs. */
Test(errors, stale_epoch, .timeout = 60)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HEARTBEAT_MS);
    tpu_resolver *r2;
    tpu_cluster *c2;
    tpu_topology *tp;
    void **b = ct_bufs(t->n, 16, TPU_F32, 1, 0, t->n);
    uint64_t old = tpu_cluster_epoch(t->c);
    char want[128];
    CALL_OK(tpu_all_reduce(t->c, b, 16, TPU_F32, TPU_SUM, NULL));
    cr_assert_eq(cluster_connect(t->cl, &r2, &c2), TPU_OK);
    CALL_OK(tpu_initialize_system(c2, NULL, &tp));
    cr_assert_eq(tpu_all_reduce(t->c, b, 16, TPU_F32, TPU_SUM, NULL), TPU_FAILED_PRECONDITION, "%s",
                 tpu_last_error());
    snprintf(want, sizeof want, "belongs to epoch %llu", (unsigned long long)old);
    cr_assert(strstr(tpu_last_error(), want), "message: %s (want '%s')", tpu_last_error(), want);
    /* the new owner's handle works */
    CALL_OK(tpu_all_reduce(c2, b, 16, TPU_F32, TPU_SUM, NULL));
    tpu_topology_free(tp);
    tpu_cluster_free(c2);
    tpu_resolver_free(r2);
    ct_free_bufs(b, t->n);
    ct_free(t);
}

Test(errors, no_system_and_bad_arguments, .timeout = 60)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HEARTBEAT_MS);
    tpu_resolver *r2;
    tpu_cluster *c2;
    void **b = ct_bufs(t->n, 16, TPU_F32, 1, 0, t->n);
    cr_assert_eq(cluster_connect(t->cl, &r2, &c2), TPU_OK);
    cr_assert_eq(tpu_all_reduce(c2, b, 16, TPU_F32, TPU_SUM, NULL), TPU_FAILED_PRECONDITION);
    /* adopting the system works without resetting it */
    CALL_OK(tpu_attach_system(c2));
    cr_assert_eq(tpu_cluster_num_replicas(c2), t->n);
    CALL_OK(tpu_all_reduce(c2, b, 16, TPU_F32, TPU_SUM, NULL));
    cr_assert_eq(tpu_broadcast(t->c, b, 16, TPU_F32, t->n, NULL), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_all_reduce(t->c, b, 16, (tpu_dtype)7, TPU_SUM, NULL), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_all_reduce(t->c, b, 16, TPU_F32, (tpu_reduce_op)9, NULL), TPU_INVALID_ARGUMENT);
    tpu_cluster_free(c2);
    tpu_resolver_free(r2);
    ct_free_bufs(b, t->n);
    ct_free(t);
}

/* tpuctl bench allreduce: the table's rows, correct, as JSON. */
Test(cli, bench_allreduce_json, .timeout = 120)
{
    colltest *t = ct_start(2, (int[]){2, 1}, NULL, HEARTBEAT_MS);
    run_result rr;
    cluster_tpuctl(t->cl, &rr, 90000, "--json", "bench", "allreduce", "--min", "4K", "--max", "64K", "--iters", "3",
                   "--warmup", "1", NULL);
    cr_assert_eq(rr.code, 0, "tpuctl bench: exit %d\n%s%s", rr.code, rr.out, rr.err);
    cr_assert(strstr(rr.out, "\"replicas\":3"), "%s", rr.out);
    cr_assert(strstr(rr.out, "\"size\":65536"), "%s", rr.out);
    cr_assert(strstr(rr.out, "\"busbw_gbps\""), "%s", rr.out);
    cr_assert(!strstr(rr.out, "\"correct\":false"), "%s", rr.out);
    run_result_free(&rr);
    cluster_tpuctl(t->cl, &rr, 90000, "bench", "allreduce", "--dtype", "bf16", "--algo", "ring", "--min", "4K",
                   "--max", "8K", "--iters", "2", NULL);
    cr_assert_eq(rr.code, 0, "tpuctl bench: exit %d\n%s%s", rr.code, rr.out, rr.err);
    cr_assert(strstr(rr.out, "busbw(GB/s)") && strstr(rr.out, "8K") && strstr(rr.out, "OK"), "%s", rr.out);
    run_result_free(&rr);
    /* timed as the anchors time theirs: --min-ms runs more iterations than
     * --iters where they are short (4 KiB takes well under 30 ms even under a
     * sanitizer on a loaded machine: 200 ms gives more than 5; the estimate is
     * the warm-up's median, which the slow first iteration does not move), and
     * each row has the cores' median iteration time */
    cluster_tpuctl(t->cl, &rr, 90000, "--json", "bench", "allreduce", "--min", "4K", "--max", "4K", "--iters", "3",
                   "--warmup", "5", "--min-ms", "200", "--warmup-ms", "50", NULL);
    cr_assert_eq(rr.code, 0, "tpuctl bench: exit %d\n%s%s", rr.code, rr.out, rr.err);
    const char *row = strstr(rr.out, "\"rows\"");
    cr_assert(row, "%s", rr.out);
    const char *it = strstr(row, "\"iters\":"), *p50 = strstr(row, "\"time_p50_ns\":");
    cr_assert(it && p50, "%s", rr.out);
    cr_assert_gt(strtoull(it + 8, NULL, 10), 5, "200 ms of 4 KiB all-reduces: %s", rr.out);
    cr_assert_gt(strtoull(p50 + 14, NULL, 10), 0, "%s", rr.out);
    cr_assert(!strstr(rr.out, "\"correct\":false"), "%s", rr.out);
    run_result_free(&rr);
    ct_free(t);
}

/* Every core of the system reports a positive HBM peak (and nothing in use), or,
 * with arg != NULL, a zero peak: what `tpuctl cluster` shows. */
static int hbm_peaks(cluster *c, void *arg)
{
    tpu_cluster_spec *s = cluster_spec(c);
    int ok = tpu_cluster_spec_num_cores(s) > 0;
    for (size_t i = 0; i < tpu_cluster_spec_num_cores(s); i++) {
        tpu_core_info ci;
        tpu_cluster_spec_core(s, i, &ci);
        if (ci.hbm_used != 0 || (arg ? ci.hbm_peak != 0 : ci.hbm_peak == 0))
            ok = 0;
    }
    tpu_cluster_spec_free(s);
    return ok;
}

/* A collective charges each core's HBM while it runs: afterwards the peak shows
 * it and nothing stays in use; a re-initialize empties the accounting. */
Test(hbm, collective_buffers_charged_then_released, .timeout = 60)
{
    colltest *t = ct_start(1, (int[]){2}, NULL, HEARTBEAT_MS);
    void **b = ct_bufs(t->n, 1 << 20, TPU_F32, 3, 0, t->n);
    CALL_OK(tpu_all_reduce(t->c, b, 1 << 20, TPU_F32, TPU_SUM, NULL));
    cr_assert(cluster_wait_until(hbm_peaks, t->cl, NULL, 5000),
              "after an all-reduce of 4 MiB every core reports an HBM peak and nothing in use");
    ct_reinit(t);
    cr_assert(cluster_wait_until(hbm_peaks, t->cl, (void *)1, 5000),
              "a re-initialize empties every core's HBM accounting, peak included");
    ct_free_bufs(b, t->n);
    ct_free(t);
}
