/* The collectives engine of one worker (coll.h): validates a client's
 * FRAME_COLL, queues it (one collective at a time, in sequence order), builds
 * this core's schedule with the chosen algorithm (build.c), runs it over the
 * links, and answers FRAME_COLL_RESULT. A failure poisons the core until the
 * system is re-initialized, and is passed on to every peer (the transport's abort). */
#include "coll.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "coll_int.h"
#include "dpconn.h"
#include "frame.h"
#include "log.h"

#define COLL_QUEUE_MAX 64
#define COLL_MAX_ITERS 100000u

struct coll {
    struct coll_env env;
    struct cop *queue; /* by seq */
    unsigned nqueue;
    struct cop *cur;
    int failed;
    uint64_t fail_seq;
    err fail_err;
    /* topology of the current epoch: host index of each replica (-1: unknown),
     * and the replicas' hosts renumbered 0.. by first appearance (what
     * coll_hosts gives a collective of every replica in order, as each
     * gradient all-reduce is: made once, not once a collective in g^2) */
    uint64_t topo_epoch;
    int *host, *host_all;
    uint32_t nhost;
    /* schedules of failed collectives still waiting for link callbacks; freed
     * at reset, when the links have dropped them (no callback can come) */
    struct sched *zombies;
    /* the direct path (direct.c): the same-host cores (replica ids) of the
     * last all-reduce that could take it, and whether they agreed (area
     * bytes, 0: no). The cores of a set see the same all-reduces, so their
     * caches name the same set exactly when one does: they all run the
     * hand-shake at the same collective, or none does. */
    int dir_n;
    int dir_set[DIRECT_MAX_L];
    size_t dir_cap, dir_one_max;
    int dir_last; /* direct.c: the area of this core's segment peers may still read */
};

void coll_stats_init(struct coll_stats *s)
{
    for (int i = 0; i < COLL_STAT_KINDS; i++)
        atomic_init(&s->done[i], 0);
    atomic_init(&s->failed, 0);
    atomic_init(&s->allreduce_bytes, 0);
}

struct coll *coll_new(const struct coll_env *env)
{
    struct coll *c = calloc(1, sizeof *c);
    if (c)
        c->env = *env;
    return c;
}

/* A collective finished on this core: kind (CollKind), ok, and for an
 * all-reduce the bytes of this replica's input times the iterations. */
static void count_done(struct coll_stats *m, int kind, int ok, uint64_t allreduce_bytes)
{
    if (!ok) {
        prom_add(&m->failed, 1);
        return;
    }
    prom_add(&m->done[kind > 0 && kind < COLL_STAT_KINDS ? kind : 0], 1);
    if (allreduce_bytes)
        prom_add(&m->allreduce_bytes, allreduce_bytes);
}

static void abort_seq(struct coll *c, uint64_t seq, const err *e)
{
    c->env.x.ops->abort(c->env.x.self, seq, e);
}

static void cop_free(struct cop *op)
{
    if (!op)
        return;
    free(op->members);
    free(op->input_copy);
    free(op->iter_ns);
    if (!op->borrowed)
        free(op->payload);
    free(op);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The median of the iterations' times (sorts them), as the anchors' per-op
 * p50: a benchmark's figure that one descheduled iteration does not move. */
static uint64_t iter_median(struct cop *op)
{
    uint32_t n = op->iters_done;
    if (!op->iter_ns || n < 2)
        return 0;
    qsort(op->iter_ns, n, sizeof *op->iter_ns, cmp_u32);
    return n & 1 ? op->iter_ns[n / 2] : ((uint64_t)op->iter_ns[n / 2 - 1] + op->iter_ns[n / 2]) / 2;
}

static void reply(struct cop *op, const err *e, const void *payload, size_t len, dp_write_cb cb, void *arg)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__Status st = TPUEMU__STATUS__INIT;
    int rc;

    h.kind = TPUEMU__FRAME_KIND__FRAME_COLL_RESULT;
    h.epoch = op->epoch;
    h.seq = op->seq;
    st.code = (Tpuemu__Code)e->code;
    st.message = (char *)e->msg;
    h.status = &st;
    h.elapsed_ns = op->iters_done ? op->total_ns / op->iters_done : 0;
    h.elapsed_p50_ns = iter_median(op);
    h.algo_used = (char *)op->algo_used;
    if (op->done) {
        coll_done_fn done = op->done;
        op->done = NULL; /* exactly once */
        done(op->done_arg, e, payload, len);
        if (cb)
            cb(arg, 0);
        return;
    }
    if (!op->conn) {
        if (cb)
            cb(arg, -1);
        return;
    }
    rc = dp_conn_send_ref(op->conn, &h, payload, len, cb, arg);
    if (rc != CODE_OK && cb)
        cb(arg, -1);
}

/* Refuses a client's COLL frame. With `abort` set (the frame belongs to this
 * epoch, so the other replicas may be running the same collective), the
 * refusal also fails the collective on every peer (the transport's abort: ABORT frames),
 * so they fail at once with this reason instead of waiting for the progress
 * timeout. A collective every replica refuses (the same bad spec sent to all)
 * poisons nobody: no core ever started it. */
struct answer_to {
    dp_conn *conn;
    coll_done_fn done;
    void *arg;
    int borrowed; /* the payload is the submitter's (coll_submit) */
};

static void drop_payload(const struct answer_to *to, uint8_t *payload)
{
    if (!to->borrowed)
        free(payload);
}

static void reply_err(struct coll *c, const struct answer_to *to, const Tpuemu__FrameHeader *h, int abort,
                      int code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void reply_err(struct coll *c, const struct answer_to *to, const Tpuemu__FrameHeader *h, int abort,
                      int code, const char *fmt, ...)
{
    struct cop op;
    err e;
    va_list ap;

    memset(&op, 0, sizeof op);
    op.conn = to->conn;
    op.done = to->done;
    op.done_arg = to->arg;
    op.seq = h->seq;
    op.epoch = h->epoch;
    op.algo_used = "";
    va_start(ap, fmt);
    err_vset(&e, code, fmt, ap);
    va_end(ap);
    log_info_limited("collective refused", "seq=%" PRIu64 " code=%s reason=%s", h->seq, code_name(code),
             log_q(e.msg));
    reply(&op, &e, NULL, 0, NULL, NULL);
    if (abort && c)
        abort_seq(c, h->seq, &e);
}

/* HBM a collective needs on one core: buffers and pipeline slots. */
uint64_t coll_plan_bytes(const Tpuemu__CollSpec *sp, int g)
{
    uint64_t esz = sp->dtype == TPUEMU__DTYPE__DTYPE_BF16 ? 2 : 4, in = sp->count * esz;
    uint64_t chunk = sp->chunk_bytes ? sp->chunk_bytes : COLL_CHUNK, b = in;
    switch (sp->kind) {
    case TPUEMU__COLL_KIND__COLL_ALL_GATHER:
        return in + in * (uint64_t)g;
    case TPUEMU__COLL_KIND__COLL_BROADCAST:
        return in;
    default:
        if (esz == 2)
            b += sp->count * 4;
        if (sp->reproducible)
            b += sp->count * 8 + repro_nblocks(sp->count) * 4;
        return b + COLL_DEPTH * (chunk * 2 < in * 2 ? chunk * 2 : in * 2);
    }
}

/* ---- topology: the host of every replica, from the transport ---- */

/* host[i] = host index (0.. by first appearance) of group rank i. */
static int coll_hosts(struct coll *c, const struct cop *op, int *host)
{
    const struct core_ident *id = c->env.id;
    int all;
    if (c->topo_epoch != id->epoch || !c->host) {
        size_t n = id->num_replicas ? id->num_replicas : 1;
        int *h = malloc(sizeof(int) * n), *ha = malloc(sizeof(int) * n);
        if (!h || !ha) {
            free(h);
            free(ha);
            return -1;
        }
        for (uint32_t r = 0; r < id->num_replicas; r++)
            h[r] = c->env.x.ops->host(c->env.x.self, (int)r);
        free(c->host);
        free(c->host_all);
        c->host = h;
        c->host_all = NULL;
        c->nhost = id->num_replicas;
        c->topo_epoch = id->epoch;
        /* every replica in order, renumbered once */
        for (uint32_t i = 0; i < id->num_replicas; i++) {
            ha[i] = (int)i;
            for (uint32_t j = 0; j < i; j++)
                if (h[j] == h[i]) {
                    ha[i] = ha[j];
                    break;
                }
        }
        c->host_all = ha;
    }
    all = op->g == (int)c->nhost;
    for (int i = 0; all && i < op->g; i++)
        all = op->members[i] == i;
    if (all) {
        memcpy(host, c->host_all, sizeof(int) * (size_t)op->g);
        return 0;
    }
    /* another group: renumber its hosts 0.. by first appearance */
    for (int i = 0; i < op->g; i++) {
        int hr = c->host[op->members[i]];
        host[i] = i;
        for (int j = 0; j < i; j++)
            if (c->host[op->members[j]] == hr) {
                host[i] = host[j];
                break;
            }
    }
    return 0;
}

/* ---- validation ---- */

static const char *kind_name(int k)
{
    switch (k) {
    case TPUEMU__COLL_KIND__COLL_ALL_REDUCE: return "all-reduce";
    case TPUEMU__COLL_KIND__COLL_BROADCAST: return "broadcast";
    case TPUEMU__COLL_KIND__COLL_ALL_GATHER: return "all-gather";
    case TPUEMU__COLL_KIND__COLL_REDUCE_SCATTER: return "reduce-scatter";
    default: return "collective";
    }
}

/* len: the payload's bytes, or with `announced` the bytes its header
 * announces (checked before anything is allocated for them). */
static int validate(struct coll *c, const Tpuemu__FrameHeader *h, uint64_t len, int announced, struct cop *op,
                    err *e)
{
    const struct core_ident *id = c->env.id;
    const hbm *mem = c->env.hbm;
    const Tpuemu__CollSpec *sp = h->coll;
    uint32_t n = id->num_replicas;

    if (!sp)
        return err_set(e, CODE_INVALID_ARGUMENT, "FRAME_COLL without a coll spec");
    if (sp->kind < TPUEMU__COLL_KIND__COLL_ALL_REDUCE || sp->kind > TPUEMU__COLL_KIND__COLL_REDUCE_SCATTER)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "coll.kind %d is not a collective (ALL_REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER)",
                       (int)sp->kind);
    if ((int)sp->op < 0 || sp->op > TPUEMU__REDUCE_OP__REDUCE_MIN)
        return err_set(e, CODE_INVALID_ARGUMENT, "coll.op %d is not SUM, MEAN, MAX or MIN", (int)sp->op);
    if ((int)sp->dtype < 0 || sp->dtype > TPUEMU__DTYPE__DTYPE_BF16)
        return err_set(e, CODE_INVALID_ARGUMENT, "coll.dtype %d is not F32 or BF16", (int)sp->dtype);
    if ((int)sp->algo < 0 || sp->algo > TPUEMU__ALGO__ALGO_HIER)
        return err_set(e, CODE_INVALID_ARGUMENT, "coll.algo %d is not AUTO, RING, HD or HIER", (int)sp->algo);
    if (sp->iters > COLL_MAX_ITERS)
        return err_set(e, CODE_INVALID_ARGUMENT, "coll.iters %u is more than %u", sp->iters, COLL_MAX_ITERS);
    if (sp->chunk_bytes && (sp->chunk_bytes < 1024 || sp->chunk_bytes > COLL_MAX_CHUNK))
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "coll.chunk_bytes %" PRIu64 " is outside 1 KiB..%u MiB (0: automatic)",
                       sp->chunk_bytes, COLL_MAX_CHUNK >> 20);
    /* groups */
    op->members = malloc(sizeof(int) * (n ? n : 1));
    if (!op->members)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    op->g = 0;
    if (sp->n_group_of_replica == 0) {
        for (uint32_t r = 0; r < n; r++)
            op->members[op->g++] = (int)r;
    } else {
        if (sp->n_group_of_replica != n)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "coll.group_of_replica has %zu entries; the system has %u replicas",
                           sp->n_group_of_replica, n);
        uint32_t mine = sp->group_of_replica[id->replica_id], gsize = 0;
        for (uint32_t r = 0; r < n; r++) {
            if (sp->group_of_replica[r] >= n)
                return err_set(e, CODE_INVALID_ARGUMENT,
                               "coll.group_of_replica[%u] = %u: group indices must be below %u", r,
                               sp->group_of_replica[r], n);
            if (sp->group_of_replica[r] == mine)
                op->members[op->g++] = (int)r;
        }
        /* every group the same size */
        for (uint32_t r = 0; r < n; r++) {
            uint32_t cnt = 0;
            for (uint32_t q = 0; q < n; q++)
                cnt += sp->group_of_replica[q] == sp->group_of_replica[r];
            if (r == 0)
                gsize = cnt;
            else if (cnt != gsize)
                return err_set(e, CODE_INVALID_ARGUMENT,
                               "coll.group_of_replica: group %u has %u replicas and group %u has %u; "
                               "all groups must be the same size",
                               sp->group_of_replica[0], gsize, sp->group_of_replica[r], cnt);
        }
    }
    for (int i = 0; i < op->g; i++)
        if (op->members[i] == id->replica_id)
            op->me = i;
    if (sp->kind == TPUEMU__COLL_KIND__COLL_BROADCAST && (sp->root < 0 || sp->root >= op->g))
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "coll.root %d is not a replica of the group (0..%d; with groups the root is "
                       "the index within each group)", (int)sp->root, op->g - 1);
    if (sp->reproducible && op->g > REPRO_MAX_TERMS)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "coll.reproducible supports groups of up to %d replicas, not %d", REPRO_MAX_TERMS,
                       op->g);
    /* sizes */
    unsigned esz = sp->dtype == TPUEMU__DTYPE__DTYPE_BF16 ? 2 : 4;
    if (sp->count > (COLL_MAX_BYTES / esz) / (uint64_t)(op->g ? op->g : 1))
        return err_set(e, CODE_RESOURCE_EXHAUSTED,
                       "coll.count %" PRIu64 " x %d replicas of %u-byte elements is more than the %llu "
                       "MiB a collective may move", sp->count, op->g, esz,
                       (unsigned long long)(COLL_MAX_BYTES >> 20));
    uint64_t in = sp->count * esz, out = in;
    if (sp->kind == TPUEMU__COLL_KIND__COLL_ALL_GATHER)
        out = in * (uint64_t)op->g;
    if (in > FRAME_MAX_PAYLOAD || out > FRAME_MAX_PAYLOAD)
        return err_set(e, CODE_RESOURCE_EXHAUSTED,
                       "%s of %" PRIu64 " elements: its %" PRIu64 "-byte buffer exceeds the %llu MiB "
                       "frame limit", kind_name(sp->kind), sp->count, out > in ? out : in,
                       (unsigned long long)(FRAME_MAX_PAYLOAD >> 20));
    op->hbm_bytes = coll_plan_bytes(sp, op->g);
    if (op->hbm_bytes > mem->capacity)
        return err_set(e, CODE_RESOURCE_EXHAUSTED,
                       "%s needs %" PRIu64 " bytes of HBM on each core; a core has %" PRIu64,
                       kind_name(sp->kind), op->hbm_bytes, mem->capacity);
    int root_sends = sp->kind != TPUEMU__COLL_KIND__COLL_BROADCAST || sp->root == op->me;
    if (len != in && !(len == 0 && !root_sends))
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "%s of %" PRIu64 " %s elements: this replica's input is %" PRIu64 " bytes, but the frame %s "
                       "%" PRIu64 "%s", kind_name(sp->kind), sp->count, esz == 2 ? "bf16" : "f32", in,
                       announced ? "announces" : "carries", len,
                       announced ? " (refused before reading or allocating them)" : "");
    if (announced) {
        /* what the HBM can give it when it starts: what is free now, plus what
         * the collective running now gives back */
        uint64_t held = c->cur && c->cur->reserved ? c->cur->hbm_bytes : 0;
        uint64_t avail = mem->capacity - (mem->used > held ? mem->used - held : 0);
        if (op->hbm_bytes > avail)
            return err_set(e, CODE_RESOURCE_EXHAUSTED,
                           "%s of %" PRIu64 " %s elements needs %" PRIu64 " bytes of HBM on core %s/%d, which has %"
                           PRIu64 " of its %" PRIu64 " free (refused before reading its %" PRIu64 "-byte payload)",
                           kind_name(sp->kind), sp->count, esz == 2 ? "bf16" : "f32", op->hbm_bytes,
                           id->host_id, id->core, avail, mem->capacity, len);
    }
    return CODE_OK;
}

/* ---- running ---- */

static void start_next(struct coll *c);

static void fail_core(struct coll *c, uint64_t seq, const err *e)
{
    if (c->failed)
        return;
    c->failed = 1;
    c->fail_seq = seq;
    c->fail_err = *e;
}

static void result_written(void *arg, int status)
{
    struct cop *op = arg;
    (void)status;
    sched_free(op->s);
    cop_free(op);
}

static void finish(struct cop *op, const err *e)
{
    struct coll *c = op->c;
    if (c->cur == op)
        c->cur = NULL;
    if (op->reserved) {
        err ignored;
        hbm_release(c->env.hbm, op->hbm_id, &ignored);
    }
    count_done(c->env.stats, op->kind, e->code == CODE_OK,
                 e->code == CODE_OK && op->kind == TPUEMU__COLL_KIND__COLL_ALL_REDUCE
                     ? op->count * (op->bf16 ? 2u : 4u) * op->iters_done
                     : 0);
    if (e->code != CODE_OK) {
        log_warn("collective failed", "seq=%" PRIu64 " kind=%s code=%s reason=%s", op->seq, op->what,
                 code_name(e->code), log_q(e->msg));
        fail_core(c, op->seq, e);
        abort_seq(c, op->seq, e);
        reply(op, e, NULL, 0, NULL, NULL);
        if (op->s)
            sched_release(op->s, &c->zombies);
        cop_free(op);
    } else {
        coll_algo_name(op);
        reply(op, e, op->out, op->out_len, result_written, op);
    }
    start_next(c);
}

static void on_sched_done(struct sched *s, const err *e)
{
    struct cop *op = s->owner;
    uint64_t now = uv_hrtime();

    if (e->code == CODE_OK && op->dir.broken) {
        err b;
        err_set(&b, CODE_INTERNAL, "%s #%" PRIu64 ": a host segment of the direct path went missing", op->what,
                op->seq);
        finish(op, &b);
        return;
    }
    if (e->code != CODE_OK) {
        op->s = s;
        finish(op, e);
        return;
    }
    op->total_ns += now - op->t0;
    if (op->iter_ns)
        op->iter_ns[op->iters_done] = now - op->t0 > UINT32_MAX ? UINT32_MAX : (uint32_t)(now - op->t0);
    op->iters_done++;
    if (op->iters_done < op->iters) {
        /* The result is the last iteration's: the input is restored before
         * it. The ones between run on what the previous one left (values
         * grow, even to inf, at the same speed), so that copying the input
         * back does not take CPU from the peers still in the collective, as
         * an out-of-place benchmark never does. The reproducible mode's
         * exponents come from the data: it always starts from the input. */
        if (op->input_copy && (op->repro || op->iters_done + 1 == op->iters))
            memcpy(op->input, op->input_copy, op->input_len);
        op->t0 = uv_hrtime();
        sched_run(s, op->iters_done);
        return;
    }
    finish(op, e);
}

/* Builds op's schedule (build.c), with the hosts of its group if the
 * hierarchical algorithm may be chosen. */
static int build(struct coll *c, struct cop *op, err *e)
{
    int *host = NULL, rc;
    if (coll_needs_hosts(op) && (!(host = malloc(sizeof(int) * (size_t)op->g)) || coll_hosts(c, op, host) != 0)) {
        free(host);
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory building %s #%llu", op->what,
                       (unsigned long long)op->seq);
    }
    rc = coll_build(op, c->env.x, host, e);
    free(host);
    return rc;
}

static void start_build(struct coll *c, struct cop *op);

static void on_handshake_done(struct sched *s, const err *e)
{
    struct cop *op = s->owner;
    struct coll *c = op->c;

    if (e->code != CODE_OK) {
        op->s = s;
        finish(op, e);
        return;
    }
    op->dir.cap = direct_agreed(s, op, &op->dir.one_max);
    c->dir_cap = op->dir.cap;
    c->dir_one_max = op->dir.one_max;
    sched_free(s);
    op->s = NULL;
    log_debug("direct all-reduce hand-shake", "seq=%" PRIu64 " cores=%d agreed=%d bytes=%zu", op->seq, op->dir.L,
              op->dir.cap != 0, op->dir.cap);
    start_build(c, op);
}

/* Whether op may take the direct path, from the cache or a hand-shake among
 * the cores of this host: 0 (op->dir.cap says), 1 (the hand-shake runs and
 * builds op when done), -1 with e set. */
static int direct_prepare(struct coll *c, struct cop *op, err *e)
{
    int *host, L, same;

    op->dir.cap = 0;
    op->dir.last = &c->dir_last;
    if (!direct_candidate(op, c->env.x))
        return 0;
    if (!(host = malloc(sizeof(int) * (size_t)op->g)) || coll_hosts(c, op, host) != 0) {
        free(host);
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory building %s #%" PRIu64, op->what, op->seq), -1;
    }
    L = direct_local_set(op, host);
    free(host);
    same = L == c->dir_n;
    for (int k = 0; same && k < L; k++)
        same = c->dir_set[k] == op->members[op->dir.loc[k]];
    if (same) {
        op->dir.cap = c->dir_cap;
        op->dir.one_max = c->dir_one_max;
        return 0;
    }
    c->dir_n = L;
    for (int k = 0; k < L; k++)
        c->dir_set[k] = op->members[op->dir.loc[k]];
    c->dir_cap = 0;
    if (L < DIRECT_MIN_L)
        return 0;
    if (!(op->s = direct_handshake(op, c->env.x, e)))
        return -1;
    op->s->done = on_handshake_done;
    sched_run(op->s, 0);
    return 1;
}

static void start(struct coll *c, struct cop *op)
{
    const struct core_ident *id = c->env.id;
    err e;

    c->cur = op;
    if (c->env.x.ops->failed(c->env.x.self, op->seq, &e) != CODE_OK)
        goto fail;
    int64_t dims[1] = {(int64_t)op->hbm_bytes};
    char label[48];
    snprintf(label, sizeof label, "%s #%" PRIu64 " buffers", op->what, op->seq);
    if (hbm_alloc(c->env.hbm, HBM_OTHER, label, "u8", dims, 1, &op->hbm_id, &e) != CODE_OK) {
        err_prefix(&e, "%s #%" PRIu64 " on core %s/%d", op->what, op->seq, id->host_id, id->core);
        goto fail;
    }
    op->reserved = 1;
    switch (direct_prepare(c, op, &e)) {
    case -1:
        goto fail;
    case 1:
        return; /* the hand-shake runs first; on_handshake_done builds */
    default:
        break;
    }
    start_build(c, op);
    return;
fail:
    finish(op, &e);
}

/* Builds op's schedule and runs it. */
static void start_build(struct coll *c, struct cop *op)
{
    err e;

    if (build(c, op, &e) != CODE_OK)
        goto fail;
    if (op->iters > 1 && op->input_len) {
        if (!(op->input_copy = malloc(op->input_len))) {
            err_set(&e, CODE_RESOURCE_EXHAUSTED, "out of memory for the input copy of %s #%" PRIu64,
                    op->what, op->seq);
            goto fail;
        }
        memcpy(op->input_copy, op->input, op->input_len);
    }
    op->s->owner = op;
    op->s->done = on_sched_done;
    op->t0 = uv_hrtime();
    sched_run(op->s, 0);
    return;
fail:
    finish(op, &e);
}

static void start_next(struct coll *c)
{
    while (!c->cur && c->queue) {
        struct cop *op = c->queue;
        c->queue = op->next;
        c->nqueue--;
        if (c->failed) {
            err e;
            err_set(&e, CODE_FAILED_PRECONDITION,
                    "collective #%" PRIu64 " failed on this core (%s); re-initialize the TPU system",
                    c->fail_seq, c->fail_err.msg);
            reply(op, &e, NULL, 0, NULL, NULL);
            abort_seq(c, op->seq, &e); /* peers running it fail now, not at the timeout */
            cop_free(op);
            continue;
        }
        start(c, op);
    }
}

/* Every check of a FRAME_COLL that its header alone decides (len: the
 * payload's bytes, or with `announced` what the header announces). 1 to go on;
 * 0 when refused: the answer was sent. op is the caller's, filled here. */
static int admit(struct coll *c, const struct answer_to *to, const Tpuemu__FrameHeader *h, uint64_t len,
                 int announced, struct cop *op)
{
    const struct core_ident *id;
    err e;

    if (!c) {
        reply_err(c, to, h, 0, CODE_UNAVAILABLE, "the collectives engine of this core is not running");
        return 0;
    }
    id = c->env.id;
    if (h->kind != TPUEMU__FRAME_KIND__FRAME_COLL) {
        reply_err(c, to, h, 0, CODE_INVALID_ARGUMENT, "frame kind %d is not a collective", (int)h->kind);
        return 0;
    }
    if (id->replica_id < 0 || id->epoch == 0) {
        reply_err(c, to, h, 0, CODE_FAILED_PRECONDITION,
                  "core %s/%d is not part of an initialized TPU system; initialize it first", id->host_id,
                  id->core);
        return 0;
    }
    if (h->epoch != id->epoch) {
        reply_err(c, to, h, 0, CODE_FAILED_PRECONDITION,
                  "this collective belongs to epoch %" PRIu64 "; the system was re-initialized (now %" PRIu64 ")",
                  h->epoch, id->epoch);
        return 0;
    }
    if (c->failed) {
        reply_err(c, to, h, 1, CODE_FAILED_PRECONDITION,
                  "collective #%" PRIu64 " failed on this core (%s); re-initialize the TPU system",
                  c->fail_seq, c->fail_err.msg);
        return 0;
    }
    op->c = c;
    op->conn = to->conn;
    op->done = to->done;
    op->done_arg = to->arg;
    op->borrowed = to->borrowed;
    op->seq = h->seq;
    op->epoch = h->epoch;
    op->algo_used = "";
    op->what = kind_name(h->coll ? h->coll->kind : 0);
    if (validate(c, h, len, announced, op, &e) != CODE_OK) {
        reply_err(c, to, h, 1, e.code, "%s", e.msg);
        return 0;
    }
    if (c->nqueue >= COLL_QUEUE_MAX) {
        reply_err(c, to, h, 1, CODE_RESOURCE_EXHAUSTED,
                  "%u collectives are already queued on core %s/%d; wait for their results",
                  c->nqueue, id->host_id, id->core);
        return 0;
    }
    return 1;
}

static void accept_frame(struct coll *c, const struct answer_to *to, const Tpuemu__FrameHeader *h,
                         uint8_t *payload, size_t len)
{
    struct cop *op, **pp;

    if (!(op = calloc(1, sizeof *op))) {
        drop_payload(to, payload);
        reply_err(c, to, h, 1, CODE_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    if (!admit(c, to, h, len, 0, op)) {
        drop_payload(to, payload);
        cop_free(op);
        return;
    }
    const Tpuemu__CollSpec *sp = h->coll;
    op->kind = sp->kind;
    op->op = sp->op;
    op->bf16 = sp->dtype == TPUEMU__DTYPE__DTYPE_BF16;
    op->algo = sp->algo;
    op->count = sp->count;
    op->root = sp->root;
    op->repro = sp->reproducible;
    op->iters = sp->iters ? sp->iters : 1;
    /* without room for the times, only the median is missing (0) */
    op->iter_ns = op->iters > 1 ? malloc(sizeof *op->iter_ns * op->iters) : NULL;
    op->chunk_bytes = sp->chunk_bytes;
    op->payload = payload;
    op->len = len;
    for (pp = &c->queue; *pp && (*pp)->seq <= op->seq; pp = &(*pp)->next)
        ;
    op->next = *pp;
    *pp = op;
    c->nqueue++;
    start_next(c);
}

int coll_check_client_header(struct coll *c, dp_conn *conn, const Tpuemu__FrameHeader *h)
{
    struct answer_to to = {conn, NULL, NULL, 0};
    struct cop *op = calloc(1, sizeof *op);
    int ok;

    if (!op) {
        reply_err(c, &to, h, 1, CODE_RESOURCE_EXHAUSTED, "out of memory");
        return 0;
    }
    ok = admit(c, &to, h, h->payload_bytes, 1, op);
    cop_free(op); /* no payload: only the checks' own state */
    return ok;
}

void coll_on_client_frame(struct coll *c, dp_conn *conn, const Tpuemu__FrameHeader *h, uint8_t *payload,
                          size_t len)
{
    struct answer_to to = {conn, NULL, NULL, 0};
    accept_frame(c, &to, h, payload, len);
}

void coll_submit(struct coll *c, const Tpuemu__FrameHeader *h, uint8_t *payload, size_t len, coll_done_fn done,
                 void *arg)
{
    struct answer_to to = {NULL, done, arg, 1};
    accept_frame(c, &to, h, payload, len);
}

void coll_abort(struct coll *c, uint64_t seq, const err *e)
{
    if (c)
        abort_seq(c, seq, e);
}

void coll_on_client_close(struct coll *c, dp_conn *conn)
{
    if (!c)
        return;
    if (c->cur && c->cur->conn == conn)
        c->cur->conn = NULL;
    for (struct cop *op = c->queue; op; op = op->next)
        if (op->conn == conn)
            op->conn = NULL;
}

void coll_reset(struct coll *c)
{
    err e;
    if (!c)
        return;
    err_set(&e, CODE_ABORTED, "the TPU system was re-initialized (epoch %" PRIu64 ") while this collective was pending",
            c->env.id->epoch);
    if (c->cur) {
        struct cop *op = c->cur;
        c->cur = NULL;
        if (op->reserved)
            hbm_release(c->env.hbm, op->hbm_id, &e);
        reply(op, &e, NULL, 0, NULL, NULL);
        sched_free(op->s); /* peers_reset dropped its link operations */
        cop_free(op);
    }
    while (c->queue) {
        struct cop *op = c->queue;
        c->queue = op->next;
        reply(op, &e, NULL, 0, NULL, NULL);
        cop_free(op);
    }
    c->nqueue = 0;
    sched_free_zombies(&c->zombies); /* peers_reset (or peers_stop) dropped their link operations */
    c->failed = 0;
    free(c->host);
    free(c->host_all);
    c->host = c->host_all = NULL;
    c->topo_epoch = 0;
    c->dir_n = 0;
    c->dir_cap = 0;
    c->dir_one_max = 0;
}

void coll_free(struct coll *c)
{
    if (!c)
        return;
    coll_reset(c);
    free(c);
}
