/* tpuctl bench allreduce: an nccl-tests style sweep of all-reduce sizes on
 * the initialized system (or one it initializes), timed by the cores
 * themselves, every result checked against a float64 reference of the known
 * inputs.
 *
 * Inputs: element i of replica r is a pseudo-random float in [-1, 1) with at
 * most 24 significant bits (exact in f32; for bf16 rounded to bf16 first), so
 * the reference sum over replicas in float64 is exact.
 * Tolerance (why): f32 SUM/MEAN: the cores add n terms in some order in
 * float32, each addition rounding by at most 2^-24 of the running magnitude:
 * |err| <= (n-1) * 2^-24 * sum|x| (+ for MEAN the final scaling, 2^-24 |ref|).
 * bf16 SUM/MEAN: accumulated in float32 as above, then rounded once to bf16:
 * + 2^-8 |ref|. MAX/MIN: exact. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "config.h"
#include "json.h"
#include "table.h"
#include "tpuctl.h"

struct bench {
    tpu_dtype dtype;
    tpu_reduce_op op;
    tpu_algo algo;
    long long min, max, iters, warmup, chunk, min_ms, warmup_ms;
    int repro;
    int n;
};

static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* Element i of replica r, as the replica holds it (bf16 already rounded). */
static double input(const struct bench *b, int r, size_t i)
{
    uint32_t h = mix((uint32_t)i * 2654435761u ^ mix((uint32_t)r + 0x9e3779b9u));
    float f = (float)((double)(h >> 8) / (double)(1u << 24) * 2.0 - 1.0);
    if (b->dtype == TPU_BF16)
        f = bf16_to_f32(bf16_from_f32(f));
    return f;
}

static void fill(const struct bench *b, void *const *bufs, size_t count)
{
    for (int r = 0; r < b->n; r++)
        for (size_t i = 0; i < count; i++) {
            float f = (float)input(b, r, i);
            if (b->dtype == TPU_BF16)
                ((uint16_t *)bufs[r])[i] = bf16_from_f32(f);
            else
                ((float *)bufs[r])[i] = f;
        }
}

/* 1 if every replica's result is within tolerance; *worst = largest error
 * as a fraction of its tolerance (0 when exact). Also checks that every
 * replica holds bitwise the same values. */
static int check(const struct bench *b, void *const *bufs, size_t count, double *worst)
{
    size_t es = tpu_dtype_size(b->dtype);
    int ok = 1;
    *worst = 0;
    for (size_t i = 0; i < count; i++) {
        double ref = 0, mag = 0, tol, got, dev;
        for (int r = 0; r < b->n; r++) {
            double x = input(b, r, i);
            if (r == 0 || b->op == TPU_SUM || b->op == TPU_MEAN)
                ref = r == 0 ? x : ref + x;
            else if (b->op == TPU_MAX)
                ref = x > ref ? x : ref;
            else
                ref = x < ref ? x : ref;
            mag += fabs(x);
        }
        if (b->op == TPU_MEAN) {
            ref /= b->n;
            mag /= b->n;
        }
        if (b->op == TPU_MAX || b->op == TPU_MIN)
            tol = 0;
        else
            tol = (b->n - 1) * ldexp(mag, -24) + ldexp(fabs(ref), -24) +
                  (b->dtype == TPU_BF16 ? ldexp(fabs(ref), -8) : 0);
        got = b->dtype == TPU_BF16 ? bf16_to_f32(((uint16_t *)bufs[0])[i]) : ((float *)bufs[0])[i];
        dev = fabs(got - ref);
        if (!(dev <= tol)) {
            ok = 0;
            *worst = tol > 0 ? (dev / tol > *worst ? dev / tol : *worst) : INFINITY;
        } else if (tol > 0 && dev / tol > *worst) {
            *worst = dev / tol;
        }
        for (int r = 1; r < b->n; r++)
            if (memcmp((char *)bufs[r] + i * es, (char *)bufs[0] + i * es, es) != 0)
                ok = 0, *worst = INFINITY;
    }
    return ok;
}

static tpu_algo parse_algo(const char *s, int *ok)
{
    static const char *const names[] = {"auto", "ring", "hd", "hier"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0)
            return (tpu_algo)i;
    *ok = 0;
    return TPU_ALGO_AUTO;
}

static tpu_reduce_op parse_op(const char *s, int *ok)
{
    static const char *const names[] = {"sum", "mean", "max", "min"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0)
            return (tpu_reduce_op)i;
    *ok = 0;
    return TPU_SUM;
}

static void size_str(char *out, size_t n, long long bytes)
{
    if (bytes >= (1ll << 20) && bytes % (1ll << 20) == 0)
        snprintf(out, n, "%lldM", bytes >> 20);
    else if (bytes >= 1024 && bytes % 1024 == 0)
        snprintf(out, n, "%lldK", bytes >> 10);
    else
        snprintf(out, n, "%lld", bytes);
}

static int fail(void)
{
    fprintf(stderr, "%s: %s\n", tpu_status_name(tpu_last_status()), tpu_last_error());
    return EXIT_ERROR;
}

/* The system to run on: the current one if initialized, else a new one. */
static int get_system(const struct tpuctl *g, tpu_resolver **r, tpu_cluster **c, int init)
{
    tpu_topology *t = NULL;
    *r = NULL;
    *c = NULL;
    if (tpu_resolver_new(g->tpu, r) != TPU_OK) {
        fprintf(stderr, "tpuctl: %s%s\n", strncmp(tpu_last_error(), "$TPUEMU_TPU_API", 15) ? "--tpu: " : "",
                tpu_last_error());
        return EXIT_USAGE;
    }
    if ((g->token_file && *g->token_file && tpu_resolver_set_token_file(*r, g->token_file) != TPU_OK) ||
        tpu_resolver_set_timeout_ms(*r, (uint32_t)g->timeout_ms) != TPU_OK ||
        tpu_connect_to_cluster(*r, c) != TPU_OK)
        return fail();
    if (!init && tpu_attach_system(*c) == TPU_OK)
        return -1;
    if (!init && tpu_last_status() != TPU_FAILED_PRECONDITION)
        return fail();
    if (tpu_initialize_system(*c, NULL, &t) != TPU_OK)
        return fail();
    tpu_topology_free(t);
    return -1;
}

static int bench_allreduce(const struct tpuctl *g, int argc, char **argv)
{
    const char *dtype = "f32", *algo = "auto", *op = "sum";
    struct bench b;
    int init = 0, rc, ok = 1, all_ok = 1;
    struct opt flags[] = {
        {"dtype", NULL, OPT_STRING, "f32", 0, 0, "f32|bf16", "element type", &dtype},
        {"algo", NULL, OPT_STRING, "auto", 0, 0, "auto|ring|hd|hier", "algorithm", &algo},
        {"op", NULL, OPT_STRING, "sum", 0, 0, "sum|mean|max|min", "reduction", &op},
        {"min", NULL, OPT_BYTES, "4K", 4, 1ll << 28, "BYTES", "smallest size per replica", &b.min},
        {"max", NULL, OPT_BYTES, "64M", 4, 1ll << 28, "BYTES", "largest size per replica (sizes double)",
         &b.max},
        {"iters", NULL, OPT_INT, "20", 1, 100000, "N", "timed iterations per size (run back to back "
                                                       "on the cores; the time is their average)", &b.iters},
        {"warmup", NULL, OPT_INT, "5", 0, 100000, "N", "untimed iterations first", &b.warmup},
        {"min-ms", NULL, OPT_INT, "0", 0, 3600000, "MS",
         "time each size for at least MS milliseconds: more iterations than --iters where the warm-up "
         "shows they are short (at most 100000)", &b.min_ms},
        {"warmup-ms", NULL, OPT_INT, "0", 0, 3600000, "MS",
         "warm up each size for at least MS milliseconds (the OpenMPI and Gloo anchors: 200 ms warm-up, "
         "700 ms timed)", &b.warmup_ms},
        {"chunk", NULL, OPT_BYTES, "0", 0, 1ll << 30, "BYTES", "pipeline chunk (0: the cores choose)",
         &b.chunk},
        {"reproducible", NULL, OPT_BOOL, NULL, 0, 0, NULL,
         "sums bitwise independent of algorithm, chunking and core count", &b.repro},
        {"init", NULL, OPT_BOOL, NULL, 0, 0, NULL,
         "initialize a new system even if one is initialized (else only when none is)", &init},
    };
    size_t nflags = sizeof flags / sizeof flags[0];
    tpu_resolver *r = NULL;
    tpu_cluster *c = NULL;
    tpu_collective_options o;
    void **bufs = NULL;
    table tb;
    json j;
    static const char *const head[] = {"size", "count", "type", "redop", "algo", "time(us)",
                                       "p50(us)", "iters", "algbw(GB/s)", "busbw(GB/s)", "check"};
    int first = argc;
    err e;

    memset(&b, 0, sizeof b);
    rc = opt_parse(flags, nflags, argc, argv, &first, &e);
    if (rc == CODE_CANCELLED) {
        opt_usage(flags, nflags,
                  "tpuctl bench allreduce [--dtype f32|bf16] [--algo auto|ring|hd|hier] [--op sum|mean|max|min] "
                  "[--min 4K] [--max 64M] [--iters N] [--warmup N] [--min-ms MS] [--warmup-ms MS] [--chunk BYTES] "
                  "[--reproducible] [--init]",
                  "All-reduce bandwidth and latency across every replica of the system, nccl-tests style: "
                  "busbw = algbw x 2(n-1)/n; time is the slowest core's average per iteration, p50 the "
                  "largest of the cores' median iteration times (the anchors' figure). Every "
                  "result is checked against a float64 reference (f32: within (n-1) x 2^-24 x sum|x|; "
                  "bf16: that + 2^-8 |ref|; max/min: exact) and for bitwise equality across replicas.");
        return EXIT_OK;
    }
    if (rc != CODE_OK || first < argc) {
        fprintf(stderr, "tpuctl bench allreduce: %s (see tpuctl bench allreduce --help)\n",
                rc != CODE_OK ? e.msg : "unexpected argument");
        return EXIT_USAGE;
    }
    b.dtype = strcmp(dtype, "bf16") == 0 ? TPU_BF16 : TPU_F32;
    if (strcmp(dtype, "bf16") && strcmp(dtype, "f32"))
        ok = 0;
    b.algo = parse_algo(algo, &ok);
    b.op = parse_op(op, &ok);
    if (!ok || b.min > b.max) {
        fprintf(stderr, "tpuctl bench allreduce: %s (see tpuctl bench allreduce --help)\n",
                !ok ? "--dtype, --algo or --op has an unknown value" : "--min is larger than --max");
        return EXIT_USAGE;
    }
    if ((rc = get_system(g, &r, &c, init)) >= 0)
        goto out;
    b.n = tpu_cluster_num_replicas(c);
    size_t es = tpu_dtype_size(b.dtype);
    if (!(bufs = calloc((size_t)b.n, sizeof *bufs))) {
        rc = EXIT_ERROR;
        goto out;
    }
    for (int i = 0; i < b.n; i++)
        if (!(bufs[i] = malloc((size_t)b.max + es))) {
            fprintf(stderr, "tpuctl bench allreduce: out of memory for %d x %lld bytes\n", b.n, b.max);
            rc = EXIT_ERROR;
            goto out;
        }
    memset(&o, 0, sizeof o);
    o.algo = b.algo;
    o.reproducible = b.repro;
    o.chunk_bytes = (size_t)b.chunk;
    if (g->json) {
        json_init(&j, stdout);
        json_obj(&j, NULL);
        json_str(&j, "collective", "all-reduce");
        json_int(&j, "replicas", b.n);
        json_str(&j, "dtype", tpu_dtype_name(b.dtype));
        json_str(&j, "op", tpu_reduce_op_name(b.op));
        json_str(&j, "algo_requested", tpu_algo_name(b.algo));
        json_bool(&j, "reproducible", b.repro);
        json_int(&j, "iters", b.iters);
        json_int(&j, "warmup", b.warmup);
        json_int(&j, "min_ms", b.min_ms);
        json_int(&j, "warmup_ms", b.warmup_ms);
        json_arr(&j, "rows");
    } else {
        printf("# all-reduce on %d replicas: %s %s, algo %s%s, %lld iterations after %lld warm-up", b.n,
               tpu_dtype_name(b.dtype), tpu_reduce_op_name(b.op), tpu_algo_name(b.algo),
               b.repro ? " (reproducible)" : "", b.iters, b.warmup);
        if (b.min_ms || b.warmup_ms)
            printf(" (at least %lld ms timed, %lld ms warm-up)", b.min_ms, b.warmup_ms);
        printf("\n");
        table_init(&tb, sizeof head / sizeof head[0], head);
    }
    char transport[8] = "";
    double bus_sum = 0;
    int rows = 0;
    for (long long size = b.min; size <= b.max; size *= 2) {
        size_t count = (size_t)size / es;
        tpu_collective_stats st;
        double worst = 0, t_us, algbw, busbw;
        char sz[32];
        int good;
        uint64_t est = 0; /* ns per iteration, from the warm-up */
        long long iters = b.iters;
        if (b.warmup || b.min_ms || b.warmup_ms) {
            o.iters = (uint32_t)(b.warmup ? b.warmup : 1);
            fill(&b, bufs, count);
            if (tpu_all_reduce(c, bufs, count, b.dtype, b.op, &o) != TPU_OK)
                goto failed;
            tpu_last_collective(c, &st);
            est = st.time_p50_ns ? st.time_p50_ns : st.time_ns; /* the median: the first one is slow */
            double more = est ? (double)b.warmup_ms * 1e6 / (double)est - (double)o.iters : 0;
            if (more >= 1) {
                o.iters = more > 100000 ? 100000u : (uint32_t)more;
                if (tpu_all_reduce(c, bufs, count, b.dtype, b.op, &o) != TPU_OK)
                    goto failed;
                tpu_last_collective(c, &st);
                est = st.time_p50_ns ? st.time_p50_ns : st.time_ns;
            }
        }
        if (b.min_ms && est) {
            double want = (double)b.min_ms * 1e6 / (double)est;
            if (want > (double)iters)
                iters = want > 100000 ? 100000 : (long long)want + 1;
        }
        o.iters = (uint32_t)iters;
        fill(&b, bufs, count);
        if (tpu_all_reduce(c, bufs, count, b.dtype, b.op, &o) != TPU_OK)
            goto failed;
        tpu_last_collective(c, &st);
        good = check(&b, bufs, count, &worst);
        all_ok &= good;
        if (st.transport[0])
            snprintf(transport, sizeof transport, "%s", st.transport);
        t_us = (double)st.time_ns / 1e3;
        algbw = st.time_ns ? (double)count * (double)es / (double)st.time_ns : 0;
        busbw = algbw * 2.0 * (b.n - 1) / b.n;
        bus_sum += busbw;
        rows++;
        size_str(sz, sizeof sz, (long long)(count * es));
        if (g->json) {
            json_obj(&j, NULL);
            json_uint(&j, "size", count * es);
            json_uint(&j, "count", count);
            json_str(&j, "dtype", tpu_dtype_name(b.dtype));
            json_str(&j, "algorithm", st.algorithm);
            json_str(&j, "transport", st.transport);
            json_uint(&j, "iters", (uint64_t)iters);
            json_uint(&j, "time_ns", st.time_ns);
            json_double(&j, "time_us", t_us, 6);
            json_uint(&j, "time_p50_ns", st.time_p50_ns);
            json_double(&j, "time_p50_us", (double)st.time_p50_ns / 1e3, 6);
            json_double(&j, "algbw_gbps", algbw, 5);
            json_double(&j, "busbw_gbps", busbw, 5);
            json_double(&j, "err_over_tol", worst, 4);
            json_bool(&j, "correct", good);
            json_end(&j);
        } else {
            table_cell(&tb, "%s", sz);
            table_cell(&tb, "%zu", count);
            table_cell(&tb, "%s", tpu_dtype_name(b.dtype));
            table_cell(&tb, "%s", tpu_reduce_op_name(b.op));
            table_cell(&tb, "%s%s%s", st.algorithm, st.transport[0] ? "/" : "", st.transport);
            table_cell(&tb, "%.1f", t_us);
            if (st.time_p50_ns)
                table_cell(&tb, "%.1f", (double)st.time_p50_ns / 1e3);
            else
                table_cell(&tb, "-");
            table_cell(&tb, "%lld", iters);
            table_cell(&tb, "%.3f", algbw);
            table_cell(&tb, "%.3f", busbw);
            if (good)
                table_cell(&tb, worst == 0 ? "OK (exact)" : "OK (%.2g of tol)", worst);
            else
                table_cell(&tb, "WRONG");
        }
        if (size > (1ll << 40))
            break;
    }
    if (g->json) {
        json_end(&j);
        json_str(&j, "transport", transport);
        json_double(&j, "avg_busbw_gbps", rows ? bus_sum / rows : 0.0, 5);
        json_bool(&j, "correct", all_ok);
        json_end(&j);
    } else {
        table_print(&tb, stdout);
        table_free(&tb);
        printf("# transport %s; average busbw %.3f GB/s; %s\n", transport[0] ? transport : "-",
               rows ? bus_sum / rows : 0.0, all_ok ? "every result correct" : "SOME RESULTS ARE WRONG");
    }
    rc = all_ok ? EXIT_OK : EXIT_ERROR;
    goto out;
failed:
    if (!g->json)
        table_free(&tb);
    rc = fail();
out:
    for (int i = 0; bufs && i < b.n; i++)
        free(bufs[i]);
    free(bufs);
    tpu_cluster_free(c);
    tpu_resolver_free(r);
    return rc;
}

int tpuctl_cmd_bench(const struct tpuctl *g, int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "allreduce") == 0)
        return bench_allreduce(g, argc - 1, argv + 1);
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: tpuctl bench allreduce [flags]   (tpuctl bench allreduce --help)\n");
        return EXIT_OK;
    }
    fprintf(stderr, "tpuctl bench: give a collective: allreduce (see tpuctl bench allreduce --help)\n");
    return EXIT_USAGE;
}
