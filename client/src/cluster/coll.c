/* Collectives through libtpuclient: validates a call, works out what every
 * replica sends and gets back, runs it on the cores (coll_io.c) and turns
 * their answers into one status plus per-replica details. Also the system
 * membership a handle needs for this: set at initialize, or adopted from the
 * cluster spec (tpu_attach_system). */
#include "coll.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "frame.h"
#include "spec_msg.h"

#define MAX_REPLICAS 4096
/* Deadline of a call: a floor plus the bytes moved at a pessimistic 20 MB/s. */
#define CALL_FLOOR_MS 30000u
#define CALL_BYTES_PER_MS 20000u

size_t tpu_dtype_size(tpu_dtype d)
{
    return d == TPU_F32 ? 4 : d == TPU_BF16 ? 2 : 0;
}

const char *tpu_dtype_name(tpu_dtype d)
{
    return d == TPU_F32 ? "f32" : d == TPU_BF16 ? "bf16" : "?";
}

const char *tpu_reduce_op_name(tpu_reduce_op o)
{
    static const char *const names[] = {"sum", "mean", "max", "min"};
    return (unsigned)o < 4 ? names[o] : "?";
}

const char *tpu_algo_name(tpu_algo a)
{
    static const char *const names[] = {"auto", "ring", "hd", "hier"};
    return (unsigned)a < 4 ? names[a] : "?";
}

void tpu_reduce_scatter_block(size_t count, int g, int k, size_t *first, size_t *n)
{
    size_t a, b;
    if (g <= 0 || k < 0 || k >= g) {
        *first = *n = 0;
        return;
    }
    /* b*count/g: exact as long as count*g fits in 64 bits (true for any
     * count a frame can carry), else by parts */
    if (count <= UINT64_MAX / (unsigned)g) {
        a = (size_t)((uint64_t)count * (unsigned)k / (unsigned)g);
        b = (size_t)((uint64_t)count * (unsigned)(k + 1) / (unsigned)g);
    } else {
        size_t q = count / (unsigned)g, m = count % (unsigned)g;
        a = q * (unsigned)k + m * (unsigned)k / (unsigned)g;
        b = q * (unsigned)(k + 1) + m * (unsigned)(k + 1) / (unsigned)g;
    }
    *first = a;
    *n = b - a;
}

/* ---- membership ---- */

void cli_coll_free(tpu_cluster *c)
{
    struct cli_coll *k = c->coll;
    if (!k)
        return;
    for (size_t r = 0; r < k->n; r++)
        dpio_close(&k->peers[r]);
    free(k->tio);
    free(k->peers);
    free(k->res);
    free(k);
    c->coll = NULL;
}

int cli_coll_set_system(tpu_cluster *c, uint64_t epoch, size_t n, const struct cli_core_ref *cores,
                        uint64_t first_seq, err *e)
{
    struct cli_coll *k;
    cli_coll_free(c);
    if (n == 0 || n > MAX_REPLICAS)
        return err_set(e, CODE_INTERNAL, "the system has %zu replicas", n);
    k = calloc(1, sizeof *k);
    if (!k || !(k->peers = calloc(n, sizeof *k->peers)) || !(k->res = calloc(n, sizeof *k->res))) {
        if (k)
            free(k->peers);
        free(k);
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    }
    k->epoch = epoch;
    k->n = n;
    k->next_seq = first_seq ? first_seq : 1;
    for (size_t r = 0; r < n; r++) {
        snprintf(k->peers[r].host, sizeof k->peers[r].host, "%s", cores[r].host ? cores[r].host : "?");
        k->peers[r].core = cores[r].core;
        snprintf(k->peers[r].addr, sizeof k->peers[r].addr, "%s", cores[r].data_addr ? cores[r].data_addr : "");
        k->peers[r].fd = -1;
    }
    c->coll = k;
    c->coll_free = cli_coll_free;
    return CODE_OK;
}

tpu_status tpu_attach_system(tpu_cluster *c)
{
    tpu_cluster_spec *s;
    struct spec_system sys;
    struct spec_worker w;
    struct cli_core_ref *refs = NULL;
    size_t n = 0, ncores;
    tpu_status st;
    err e;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    if ((st = tpu_cluster_spec_get(c, &s)) != TPU_OK)
        return st;
    spec_system(s, &sys);
    ncores = spec_ncores(s);
    if (!sys.initialized) {
        tpu_cluster_spec_free(s);
        return cli_failf(TPU_FAILED_PRECONDITION,
                         "no TPU system is initialized (epoch %llu); initialize it first (tpuctl init)",
                         (unsigned long long)sys.epoch);
    }
    /* the system's cores: those reset into the current epoch with a replica id */
    for (size_t i = 0; i < ncores; i++) {
        spec_worker_at(s, i, &w);
        if (w.epoch == sys.epoch && w.replica_id >= 0 && (size_t)w.replica_id < ncores && (size_t)w.replica_id + 1 > n)
            n = (size_t)w.replica_id + 1;
    }
    if (n == 0 || !(refs = calloc(n, sizeof *refs))) {
        tpu_cluster_spec_free(s);
        return n ? cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory")
                 : cli_failf(TPU_FAILED_PRECONDITION,
                             "the resolver lists no core of the system of epoch %llu; re-initialize it",
                             (unsigned long long)sys.epoch);
    }
    for (size_t i = 0; i < ncores; i++) {
        spec_worker_at(s, i, &w);
        if (w.epoch == sys.epoch && w.replica_id >= 0 && (size_t)w.replica_id < n) {
            refs[w.replica_id].host = w.host_id;
            refs[w.replica_id].core = w.core;
            refs[w.replica_id].data_addr = w.data_addr;
        }
    }
    for (size_t r = 0; r < n; r++)
        if (!refs[r].data_addr) {
            free(refs);
            tpu_cluster_spec_free(s);
            return cli_failf(TPU_FAILED_PRECONDITION,
                             "replica %zu of the system of epoch %llu is not listed by the resolver (its core "
                             "died?); re-initialize the TPU system",
                             r, (unsigned long long)sys.epoch);
        }
    /* Another client may have run collectives in this epoch (one at a time):
     * start away from its sequence numbers, at 1000 x (wall-clock seconds mod
     * 10^6) + 1, which stays readable in messages ("#123456001"). */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t first = (uint64_t)(ts.tv_sec % 1000000) * 1000 + 1;
    int rc = cli_coll_set_system(c, sys.epoch, n, refs, first, &e);
    if (rc == CODE_OK) {
        c->epoch = sys.epoch;
        c->seen_epoch = sys.epoch;
        c->coll->progress_ms = sys.heartbeat_ms && sys.dead_after ? sys.heartbeat_ms * sys.dead_after : 0;
    }
    free(refs);
    tpu_cluster_spec_free(s);
    return rc == CODE_OK ? TPU_OK : cli_fail(&e);
}

int tpu_cluster_num_replicas(const tpu_cluster *c)
{
    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    return c->coll ? (int)c->coll->n : 0;
}

/* ---- one call ---- */

struct call {
    enum coll_kind kind;
    const char *what;
    tpu_dtype dtype;
    tpu_reduce_op op;
    int root;
    size_t count;
    const void *const *in;
    void *const *out;
};

/* Group size g and each replica's position in its group; INVALID_ARGUMENT if
 * the assignment is not a partition into groups of one size. */
static int groups(const int *ga, size_t n, int *g, int *pos, err *e)
{
    int *size = calloc(n, sizeof *size);
    int rc = CODE_OK;
    if (!size)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    *g = (int)n;
    for (size_t r = 0; r < n; r++) {
        if (!ga) {
            pos[r] = (int)r;
            continue;
        }
        if (ga[r] < 0 || (size_t)ga[r] >= n) {
            rc = err_set(e, CODE_INVALID_ARGUMENT,
                         "group_assignment[%zu] = %d: group indices go from 0 to %zu (one per replica at most)",
                         r, ga[r], n - 1);
            goto out;
        }
        pos[r] = size[ga[r]]++;
    }
    if (ga) {
        *g = 0;
        for (size_t i = 0; i < n; i++) {
            if (!size[i])
                continue;
            if (*g && size[i] != *g) {
                rc = err_set(e, CODE_INVALID_ARGUMENT,
                             "group_assignment: group %zu has %d replicas but another has %d; every group "
                             "must have the same size", i, size[i], *g);
                goto out;
            }
            *g = size[i];
        }
    }
out:
    free(size);
    return rc;
}

uint64_t cli_coll_progress_ms(tpu_cluster *c)
{
    struct cli_coll *k = c->coll;
    if (!k->progress_ms) {
        tpu_cluster_spec *s;
        k->progress_ms = COLL_DEFAULT_PROGRESS_MS;
        if (tpu_cluster_spec_get(c, &s) == TPU_OK) {
            uint32_t hb = tpu_cluster_spec_heartbeat_ms(s), da = tpu_cluster_spec_dead_after(s);
            if (hb && da)
                k->progress_ms = hb * da;
            tpu_cluster_spec_free(s);
        }
    }
    return k->progress_ms;
}

uint64_t cli_coll_grace_ms(tpu_cluster *c)
{
    return 2 * cli_coll_progress_ms(c) + 1000;
}

static tpu_status run(tpu_cluster *c, const struct call *a, const tpu_collective_options *o)
{
    struct coll_io_spec spec;
    struct cli_coll *k;
    struct cli_part *parts = NULL;
    uint32_t *gor = NULL;
    int *pos = NULL, g = 0;
    size_t es = tpu_dtype_size(a->dtype), n, failed, bytes = 0;
    uint64_t seq, t0, deadline, iters;
    tpu_status st = TPU_OK;
    err e;

    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    CLI_CALL(c);
    k = c->coll;
    if (!k)
        return cli_failf(TPU_FAILED_PRECONDITION,
                         "%s: this handle has no TPU system; call tpu_initialize_system or "
                         "tpu_attach_system first", a->what);
    n = k->n;
    if (!es)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: unknown dtype %d", a->what, (int)a->dtype);
    if ((unsigned)a->op > TPU_MIN)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: unknown reduce op %d", a->what, (int)a->op);
    if (o && (unsigned)o->algo > TPU_ALGO_HIER)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: unknown algorithm %d", a->what, (int)o->algo);
    if ((a->count && (!a->in || !a->out)) || a->count > FRAME_MAX_PAYLOAD / es)
        return cli_failf(a->count > FRAME_MAX_PAYLOAD / es ? TPU_RESOURCE_EXHAUSTED : TPU_INVALID_ARGUMENT,
                         a->count > FRAME_MAX_PAYLOAD / es ? "%s: %zu elements per replica is more than a "
                                                             "frame carries (%llu bytes)"
                                                           : "%s: buffers are NULL for %zu elements",
                         a->what, a->count, (unsigned long long)FRAME_MAX_PAYLOAD);
    if (a->kind == COLL_IO_BROADCAST && (a->root < 0 || (size_t)a->root >= n))
        return cli_failf(TPU_INVALID_ARGUMENT, "broadcast: root %d is not a replica (0..%zu)", a->root, n - 1);
    if (!(pos = calloc(n, sizeof *pos)) || !(parts = calloc(n, sizeof *parts)) ||
        (o && o->group_assignment && !(gor = calloc(n, sizeof *gor)))) {
        st = cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    if (groups(o ? o->group_assignment : NULL, n, &g, pos, &e) != CODE_OK) {
        err_prefix(&e, "%s", a->what);
        st = cli_fail(&e);
        goto out;
    }
    for (size_t r = 0; r < n; r++) {
        struct cli_part *p = &parts[r];
        const void *in = a->in ? a->in[r] : NULL;
        void *out = a->out ? a->out[r] : NULL;
        size_t first, cnt;
        if (a->count && (!in || !out)) {
            st = cli_failf(TPU_INVALID_ARGUMENT, "%s: the buffer of replica %zu is NULL", a->what, r);
            goto out;
        }
        p->in = in;
        p->in_len = a->count * es;
        p->out = out;
        p->out_len = a->count * es;
        switch (a->kind) {
        case COLL_IO_BROADCAST:
            if ((int)r != a->root)
                p->in_len = 0;
            break;
        case COLL_IO_ALL_GATHER:
            p->out_len = a->count * es * (size_t)g;
            break;
        case COLL_IO_REDUCE_SCATTER:
            tpu_reduce_scatter_block(a->count, g, pos[r], &first, &cnt);
            p->out_len = cnt * es;
            break;
        default:
            break;
        }
        bytes += p->in_len + p->out_len;
        if (gor)
            gor[r] = (uint32_t)o->group_assignment[r];
    }
    memset(&spec, 0, sizeof spec);
    spec.kind = a->kind;
    spec.op = (int)a->op;
    spec.dtype = (int)a->dtype;
    spec.algo = o ? (int)o->algo : (int)TPU_ALGO_AUTO;
    spec.count = a->count;
    spec.root = a->root;
    spec.reproducible = o && o->reproducible;
    spec.n_group_of_replica = gor ? n : 0;
    spec.group_of_replica = gor;
    spec.iters = o ? o->iters : 0;
    spec.chunk_bytes = o ? o->chunk_bytes : 0;
    iters = spec.iters ? spec.iters : 1;

    uint64_t grace = cli_coll_grace_ms(c);
    uint64_t floor = 2 * cli_coll_progress_ms(c) > CALL_FLOOR_MS ? 2 * cli_coll_progress_ms(c) : CALL_FLOOR_MS;
    t0 = wire_now_ms();
    deadline = t0 + floor + (uint64_t)bytes / CALL_BYTES_PER_MS * iters;
    seq = k->next_seq++;
    memset(&k->last, 0, sizeof k->last);
    k->last.seq = seq;
    k->last.num_replicas = (int)n;
    k->last.iters = (uint32_t)iters;
    if (dpio_connect(k->peers, n, &c->r->auth, c->r->sender, deadline, &e) != CODE_OK) {
        for (size_t r = 0; r < n; r++) {
            k->res[r].code = e.code;
            snprintf(k->res[r].msg, sizeof k->res[r].msg, "%s", e.msg);
            k->res[r].mono_ms = 0;
        }
        k->last.num_failed = (int)n;
        err_prefix(&e, "%s #%llu", a->what, (unsigned long long)seq);
        st = cli_fail(&e);
        goto out;
    }
    failed = coll_io_run(k->peers, n, k->epoch, &spec, seq, a->what, parts, k->res, deadline, grace, &c->cancel);
    k->last.wall_ns = (wire_now_ms() - t0) * 1000000ull;
    k->last.num_failed = (int)failed;
    for (size_t r = 0; r < n; r++) {
        struct cli_res *res = &k->res[r];
        if (res->code != CODE_OK)
            continue;
        if (res->ns > k->last.time_ns)
            k->last.time_ns = res->ns;
        if (res->p50_ns > k->last.time_p50_ns)
            k->last.time_p50_ns = res->p50_ns;
        if (!k->last.algorithm[0]) {
            snprintf(k->last.algorithm, sizeof k->last.algorithm, "%s", res->algo);
            char *plus = strchr(k->last.algorithm, '+');
            if (plus)
                *plus = '\0';
        }
        if (strstr(res->algo, "+shm"))
            snprintf(k->last.transport, sizeof k->last.transport, "shm");
        else if (!k->last.transport[0] && n > 1)
            snprintf(k->last.transport, sizeof k->last.transport, "tcp");
    }
    if (failed) {
        /* a core's own word first (it names the root cause), earliest first */
        const struct cli_res *best = NULL;
        for (size_t r = 0; r < n; r++) {
            const struct cli_res *res = &k->res[r];
            if (res->code == CODE_OK || (best && best->code == CODE_CANCELLED))
                continue;
            if (!best || res->code == CODE_CANCELLED || (res->from_core && !best->from_core) ||
                (res->from_core == best->from_core && res->mono_ms && (!best->mono_ms || res->mono_ms < best->mono_ms)))
                best = res;
        }
        st = cli_failf((tpu_status)best->code, "%s", best->msg);
    }
out:
    free(pos);
    free(parts);
    free(gor);
    return st;
}

tpu_status tpu_all_reduce(tpu_cluster *c, void *const *bufs, size_t count, tpu_dtype dtype, tpu_reduce_op op,
                          const tpu_collective_options *opts)
{
    struct call a = {COLL_IO_ALL_REDUCE, "all-reduce", dtype, op, 0, count, (const void *const *)bufs, bufs};
    return run(c, &a, opts);
}

tpu_status tpu_broadcast(tpu_cluster *c, void *const *bufs, size_t count, tpu_dtype dtype, int root,
                         const tpu_collective_options *opts)
{
    struct call a = {COLL_IO_BROADCAST, "broadcast", dtype, TPU_SUM, root, count, (const void *const *)bufs, bufs};
    return run(c, &a, opts);
}

tpu_status tpu_all_gather(tpu_cluster *c, const void *const *in, void *const *out, size_t count, tpu_dtype dtype,
                          const tpu_collective_options *opts)
{
    struct call a = {COLL_IO_ALL_GATHER, "all-gather", dtype, TPU_SUM, 0, count, in, out};
    return run(c, &a, opts);
}

tpu_status tpu_reduce_scatter(tpu_cluster *c, const void *const *in, void *const *out, size_t count,
                              tpu_dtype dtype, tpu_reduce_op op, const tpu_collective_options *opts)
{
    struct call a = {COLL_IO_REDUCE_SCATTER, "reduce-scatter", dtype, op, 0, count, in, out};
    return run(c, &a, opts);
}

/* ---- what happened ---- */

tpu_status tpu_last_collective(const tpu_cluster *c, tpu_collective_stats *out)
{
    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_last_collective: out is NULL");
    if (!c->coll || !c->coll->last.seq)
        return cli_failf(TPU_FAILED_PRECONDITION, "no collective ran on this handle since it initialized");
    *out = c->coll->last;
    return TPU_OK;
}

tpu_status tpu_last_collective_replica(const tpu_cluster *c, int replica, tpu_replica_result *out)
{
    const struct cli_res *res;
    CHECK_HANDLE(c, MAGIC_CLUSTER, "tpu_cluster");
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_last_collective_replica: out is NULL");
    if (!c->coll || !c->coll->last.seq)
        return cli_failf(TPU_FAILED_PRECONDITION, "no collective ran on this handle since it initialized");
    if (replica < 0 || (size_t)replica >= c->coll->n)
        return cli_failf(TPU_OUT_OF_RANGE, "replica %d is out of range (0..%zu)", replica, c->coll->n - 1);
    res = &c->coll->res[replica];
    out->status = (tpu_status)res->code;
    out->message = res->msg;
    out->answered_mono_ms = res->mono_ms;
    out->time_ns = res->ns;
    out->time_p50_ns = res->p50_ns;
    out->algorithm = res->algo;
    return TPU_OK;
}
