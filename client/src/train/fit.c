/* fit, evaluate and predict: the client's step loop. Batches come from the
 * dataset iterator, are split by rows into one shard per replica (sent
 * straight from the batch buffers), and up to infeed_depth executions are in
 * flight at once, so the cores always have their next infeed when a step
 * ends. Answers come back in order; their per-step metrics are summed over
 * the replicas into the logs. */
#include "model_int.h"

#include "hostin.h"

#include "bf16.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* How long the steps in flight may take to finish after tpu_cancel. */
#define FIT_CANCEL_DRAIN_MS 2000u
#define HISTORY_MAX 100000

struct tpu_history {
    size_t n, cap;
    tpu_logs *e;
    size_t nev, capev;
    tpu_elastic_event *ev;
};

size_t tpu_history_num_epochs(const tpu_history *h)
{
    return h ? h->n : 0;
}

tpu_status tpu_history_epoch(const tpu_history *h, size_t i, tpu_logs *out)
{
    if (!h || i >= h->n)
        return cli_failf(TPU_OUT_OF_RANGE, "the history has %zu epochs", h ? h->n : 0);
    *out = h->e[i];
    return TPU_OK;
}

size_t tpu_history_num_events(const tpu_history *h)
{
    return h ? h->nev : 0;
}

tpu_status tpu_history_event(const tpu_history *h, size_t i, tpu_elastic_event *out)
{
    if (!h || i >= h->nev || !out)
        return cli_failf(TPU_OUT_OF_RANGE, "the history has %zu elastic events", h ? h->nev : 0);
    *out = h->ev[i];
    return TPU_OK;
}

const char *tpu_elastic_event_kind_name(tpu_elastic_event_kind k)
{
    switch (k) {
    case TPU_ELASTIC_NOTICE: return "NOTICE";
    case TPU_ELASTIC_RESTORED: return "RESTORED";
    case TPU_ELASTIC_SHRUNK: return "SHRUNK";
    case TPU_ELASTIC_GREW:
        return "GREW";
    }
    return NULL;
}

void tpu_history_free(tpu_history *h)
{
    if (!h)
        return;
    free(h->e);
    free(h->ev);
    free(h);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- one execution in flight ---- */

struct exec {
    tpu_batch b[TIO_MAX_STEPS];
    size_t nb;
    struct tio_ans *ans;      /* n */
    struct tio_ans **pa;      /* n */
    struct dpio_seg *segs;     /* n x 2 x steps */
    uint64_t input_wait_ns;
    uint16_t *bx; /* a bfloat16 infeed: the batches' x, converted (bx_cap values) */
    size_t bx_cap;
    int fanned;      /* sent to replica 0 alone, which answers for every core */
    int others_none; /* ans[1..n) are tio_ans_none's still (a fanned request's, untouched since) */
};

struct run {
    tpu_model *m;
    tpu_dataset_iter *it;
    uint64_t epoch;
    const struct hin_spec *hin; /* host-side input: the hosts make the infeed */
    uint32_t hin_num;
    int mode; /* tpu_step_fn */
    size_t n, spe, depth;
    int x_bf16;               /* x goes as bfloat16 (see post_next) */
    struct exec *ex;          /* depth */
    size_t head, inflight;
    int eof;
    int cancelled;            /* tpu_cancel: no more steps are posted, those in flight finish */
    uint64_t drain_deadline;  /* ... until then (wire_now_ms) */
    size_t batches_done;
    size_t open_share; /* cores that open their pipelines on one CPU at once (open_share) */
    uint32_t fanout;   /* host-side input on this many cores or more: requests fan out (fanout_degree) */
    /* sums */
    double loss_sum;
    int64_t correct, rows;
    /* predict */
    float *out;
    size_t out_rows, out_put;
    size_t units;
};

static void shard(size_t rows, size_t n, size_t r, size_t *first, size_t *cnt)
{
    size_t base = rows / n, extra = rows % n;
    *first = r * base + (r < extra ? r : extra);
    *cnt = base + (r < extra ? 1 : 0);
}

static void exec_release(struct run *u, struct exec *x)
{
    for (size_t i = 0; i < x->nb; i++)
        tpu_dataset_iter_release(u->it, &x->b[i]);
    x->nb = 0;
}

static int check_labels(const tpu_model *m, const tpu_batch *b, err *e)
{
    if (m->co.loss != TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY || !b->y)
        return CODE_OK;
    const int32_t *y = b->y;
    int32_t units = (int32_t)m->units[m->nlayers - 1];
    for (size_t i = 0; i < b->rows; i++)
        if (y[i] < 0 || y[i] >= units)
            return err_set(e, CODE_INVALID_ARGUMENT, "label %d in row %zu of batch %zu is outside 0..%d (the last "
                           "layer has %d units)", (int)y[i], i, b->index, (int)units - 1, (int)units);
    return CODE_OK;
}

/* Fills the next free execution from the iterator and posts it; sets u->eof
 * at the end of the epoch. */
static int post_next(struct run *u, err *e)
{
    tpu_model *m = u->m;
    tpu_cluster *c = m->s->c;
    struct exec *x = &u->ex[(u->head + u->inflight) % u->depth];
    size_t lbytes = m->co.loss == TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY ? sizeof(int32_t)
                                                                           : sizeof(float) * m->units[m->nlayers - 1];
    size_t spe = u->mode == TPU_STEP_PREDICT ? 1 : u->spe;
    tpu_status st;

    uint64_t input_start = now_ns();
    x->nb = 0;
    x->input_wait_ns = 0;
    while (x->nb < spe) {
        tpu_batch *b = &x->b[x->nb];
        if ((st = tpu_dataset_iter_next(u->it, b)) != TPU_OK) {
            exec_release(u, x);
            return err_set(e, (int)st, "reading the dataset: %s", tpu_last_error());
        }
        x->input_wait_ns += b->wait_ns;
        if (b->rows == 0) {
            tpu_dataset_iter_release(u->it, b);
            u->eof = 1;
            break;
        }
        if (check_labels(m, b, e) != CODE_OK) {
            x->nb++;
            exec_release(u, x);
            return e->code;
        }
        x->nb++;
    }
    if (x->nb == 0)
        return CODE_OK;
    int xb = u->x_bf16 && !u->hin;
    if (xb) { /* the shards' x as bfloat16, in batch order: each shard's rows stay contiguous */
        size_t need = 0;
        for (size_t i = 0; i < x->nb; i++)
            need += x->b[i].rows * m->in_dim;
        if (need > x->bx_cap) {
            uint16_t *p = realloc(x->bx, need * sizeof *p);
            if (!p) {
                exec_release(u, x);
                return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for a %zu-value infeed", need);
            }
            x->bx = p;
            x->bx_cap = need;
        }
        need = 0;
        for (size_t i = 0; i < x->nb; i++) {
            bf16_from_f32_n(x->bx + need, x->b[i].x, x->b[i].rows * m->in_dim);
            need += x->b[i].rows * m->in_dim;
        }
    }

    struct tio_steps ss;
    uint32_t rows[TIO_MAX_STEPS], grows[TIO_MAX_STEPS];
    uint64_t hb[TIO_MAX_STEPS];
    memset(&ss, 0, sizeof ss);
    if (u->hin) {
        for (size_t i = 0; i < x->nb; i++)
            hb[i] = x->b[i].index;
        ss.hin = u->hin;
        ss.hin_num = u->hin_num;
        ss.hin_epoch = u->epoch;
        ss.hin_batches = hb;
    }
    ss.model_id = m->id;
    ss.mode = (tpu_step_fn)u->mode;
    ss.steps = (uint32_t)x->nb;
    ss.rows = rows;
    ss.global_rows = grows;
    int has_labels = u->mode != TPU_STEP_PREDICT;
    /* after the steps of the executions still in flight */
    ss.first_step = m->step + 1;
    for (size_t i = 0; u->mode == TPU_STEP_TRAIN && i < u->inflight; i++)
        ss.first_step += u->ex[(u->head + i) % u->depth].nb;
    ss.colls_per_step = model_sync_calls_per_step(m);
    ss.x_bf16 = xb;
    /* host-side input on many cores: one request, to replica 0, which passes
     * it on down a tree and answers for every core */
    int fan = u->fanout && u->hin && u->mode != TPU_STEP_PREDICT;
    ss.fanout = fan ? u->fanout : 0;
    ss.fanout_cores = (uint32_t)u->n;
    ss.fanout_wait_ms = (uint32_t)cli_coll_grace_ms(c);
    x->fanned = fan;
    x->others_none &= fan; /* a request to every core rewrites them */
    tio_steps_begin(c, &ss);
    for (size_t r = 0, nr = fan && x->others_none ? 1 : u->n; r < nr; r++) {
        struct dpio_seg *sg = &x->segs[r * 2 * TIO_MAX_STEPS];
        if (fan && r > 0) {
            tio_ans_none(&x->ans[r]); /* in replica 0's answer */
            continue;
        }
        size_t ns = 0, bo = 0;
        for (size_t i = 0; i < x->nb; i++) {
            size_t first, cnt;
            shard(x->b[i].rows, u->n, r, &first, &cnt);
            rows[i] = (uint32_t)cnt;
            grows[i] = (uint32_t)x->b[i].rows;
            if (u->hin)
                continue; /* the core's host makes its rows */
            if (xb) {
                sg[ns].p = x->bx + bo + first * m->in_dim;
                sg[ns++].n = cnt * m->in_dim * sizeof(uint16_t);
            } else {
                sg[ns].p = x->b[i].x + first * m->in_dim;
                sg[ns++].n = cnt * m->in_dim * sizeof(float);
            }
            bo += x->b[i].rows * m->in_dim;
            if (has_labels) {
                sg[ns].p = (const uint8_t *)x->b[i].y + first * lbytes;
                sg[ns++].n = cnt * lbytes;
            }
        }
        x->ans[r].dst = NULL;
        x->ans[r].dst_cap = 0;
        if (u->mode == TPU_STEP_PREDICT) {
            size_t first, cnt;
            shard(x->b[0].rows, u->n, r, &first, &cnt);
            if (u->out_put + x->b[0].rows > u->out_rows) {
                exec_release(u, x);
                return err_set(e, CODE_OUT_OF_RANGE, "the dataset has more than the %zu rows there is room for",
                               u->out_rows);
            }
            x->ans[r].dst = u->out + (u->out_put + first) * u->units;
            x->ans[r].dst_cap = cnt * u->units * sizeof(float);
        }
        /* the client's part, for the profiler: sent to the first replica only */
        ss.client_input_start_ns = r == 0 ? input_start : 0;
        ss.client_input_wait_ns = r == 0 ? x->input_wait_ns : 0;
        ss.client_post_ns = r == 0 ? now_ns() : 0;
        ss.client_pid = r == 0 ? (uint32_t)getpid() : 0;
        ss.hin_id = (uint32_t)r;
        if (tio_post_steps(c, r, &ss, sg, ns, &x->ans[r], e) != CODE_OK) {
            exec_release(u, x);
            tio_abort(c);
            return e->code;
        }
    }
    x->others_none = fan;
    if (u->mode == TPU_STEP_PREDICT)
        u->out_put += x->b[0].rows;
    u->inflight++;
    return CODE_OK;
}

/* tpu_cancel ran: no more steps are posted, and those in flight get
 * FIT_CANCEL_DRAIN_MS to finish on every replica alike, so that the model
 * stays whole; a second tpu_cancel cuts that short. */
static void stop_cleanly(struct run *u)
{
    if (u->cancelled)
        return;
    u->cancelled = 1;
    u->eof = 1;
    u->drain_deadline = wire_now_ms() + FIT_CANCEL_DRAIN_MS;
    cli_cancel_rearm(&u->m->s->c->cancel);
}

/* Waits for the oldest execution and folds its answers in. */
static int finish_oldest(struct run *u, uint64_t *t_last, err *e)
{
    tpu_model *m = u->m;
    tpu_cluster *c = m->s->c;
    struct exec *x = &u->ex[u->head];
    size_t bytes = 0;
    for (size_t i = 0; i < x->nb; i++)
        bytes += x->b[i].rows * (m->in_dim + 1) * sizeof(float) / u->n;
    /* host-side input: a host may be reading its files for this execution
     * (the first of a dataset): the time for their bytes too, as many times
     * as cores share a CPU reading them */
    size_t hin_bytes = u->hin ? (size_t)u->hin->rows * u->hin->x_dim * u->open_share : 0;
    uint64_t grace = cli_coll_grace_ms(c);
    size_t nw = x->fanned ? 1 : u->n; /* fanned out: replica 0 answers for all */
    size_t failed = u->cancelled
                        ? tio_wait_first(c, x->pa, nw, u->drain_deadline, grace, 0)
                        : tio_wait_first(c, x->pa, nw, model_deadline(c, bytes * u->depth + hin_bytes), grace, 1);
    if (failed == TIO_INTERRUPTED) {
        stop_cleanly(u);
        failed = tio_wait_first(c, x->pa, nw, u->drain_deadline, grace, 0);
    }
    u->head = (u->head + 1) % u->depth;
    u->inflight--;
    if (failed && u->cancelled) {
        const struct tio_ans *w = tio_worst(x->pa, u->n);
        char why[64];
        if (w && w->code == CODE_CANCELLED)
            snprintf(why, sizeof why, "a second tpu_cancel came first");
        else
            snprintf(why, sizeof why, "not within %u ms", FIT_CANCEL_DRAIN_MS);
        err_set(e, CODE_CANCELLED, "the call was cancelled (tpu_cancel) before the steps in flight finished (%s; %s): "
                "the replicas may be out of step; re-initialize the TPU system and restore the model (load a "
                "checkpoint, or compile it again)", why, w ? w->msg : "a step failed");
        exec_release(u, x);
        tio_abort(c);
        return e->code;
    }
    if (failed) {
        const struct tio_ans *w = tio_worst(x->pa, u->n);
        struct tio_ans **all = NULL;
        int lost = 0;
        for (size_t r = 0; r < u->n; r++)
            lost |= x->ans[r].code == CODE_UNAVAILABLE || x->ans[r].code == CODE_DEADLINE_EXCEEDED ||
                    x->ans[r].code == CODE_CANCELLED;
        /* A core stopped in the middle of a step (paused, or starved of CPU)
         * finishes that step after its peers have, then finds a connection
         * they closed when they gave up on it in the next step: its failure
         * names an innocent peer. The next steps in flight name the core that
         * stopped: their answers wait in the connections. Read them, and
         * report the failure that says most. */
        if (lost && tio_rank(w) < TIO_RANK_CULPRIT && u->inflight > 0 &&
            (all = malloc((u->inflight + 1) * u->n * sizeof *all)) != NULL) {
            size_t na = 0;
            uint64_t until = wire_now_ms() + 500; /* they are there, or a core is cut off */
            for (size_t r = 0; r < u->n; r++)
                all[na++] = x->pa[r];
            for (size_t k = 0; k < u->inflight; k++) {
                struct exec *y = &u->ex[(u->head + k) % u->depth];
                tio_wait_first(c, y->pa, y->fanned ? 1 : u->n, until, 0, 0);
                for (size_t r = 0; r < u->n; r++)
                    if (y->pa[r]->said) /* not "did not answer": that is this wait's own word */
                        all[na++] = y->pa[r];
            }
            w = tio_worst(all, na);
        }
        err_set(e, w ? w->code : CODE_UNKNOWN, "%s", w ? w->msg : "the step failed");
        free(all);
        exec_release(u, x);
        if (lost)
            tio_abort(c);
        return e->code;
    }
    if (x->fanned && x->ans[0].cores != u->n) { /* a core that did not pass it on answers for itself */
        err_set(e, CODE_INTERNAL, "core %s/%d answered for %u cores of %zu", c->coll->peers[0].host,
                c->coll->peers[0].core, x->ans[0].cores, u->n);
        exec_release(u, x);
        tio_abort(c);
        return e->code;
    }
    uint64_t now = now_ns();
    size_t nr = x->fanned ? 1 : u->n; /* the answers that say anything */
    for (size_t i = 0; i < x->nb; i++) {
        tpu_step_stats s;
        memset(&s, 0, sizeof s);
        for (size_t r = 0; r < nr; r++) {
            const struct tio_stat *a = i < x->ans[r].nstats ? &x->ans[r].stats[i] : NULL;
            if (!a)
                continue;
            u->loss_sum += a->loss_sum;
            u->correct += a->correct;
            u->rows += a->rows;
            model_stats_max(&s, a);
        }
        if (u->mode == TPU_STEP_TRAIN) {
            m->step++;
            m->cur_batch++;
            m->iterations++;
        }
        s.step = m->step;
        s.rows = x->b[i].rows;
        s.wall_ns = (now - *t_last) / x->nb;
        s.input_wait_ns = x->input_wait_ns / x->nb;
        m->last = s;
    }
    m->notice.kind = TPU_NOTICE_NONE;
    m->notice_replica = -1;
    for (size_t r = 0; r < nr; r++) {
        if (x->ans[r].hbm_used > m->hbm_used)
            m->hbm_used = x->ans[r].hbm_used;
        /* the soonest event of any replica's notice */
        if (x->ans[r].notice.kind != TPU_NOTICE_NONE &&
            (m->notice.kind == TPU_NOTICE_NONE || x->ans[r].notice.event_in_ms < m->notice.event_in_ms)) {
            m->notice = x->ans[r].notice;
            m->notice_replica = x->ans[r].notice_replica >= 0 ? x->ans[r].notice_replica : (int)r;
        }
    }
    *t_last = now;
    u->batches_done += x->nb;
    exec_release(u, x);
    return CODE_OK;
}

/* What fit keeps in the model between epochs (and calls): the executions'
 * buffers, megabytes on hundreds of cores (each core's answer slots and
 * infeed segments), which each epoch used to allocate and fault in anew, and
 * open_share, which compares every core's address with every other's. */
struct fit_cache {
    struct exec *ex; /* NULL: taken by a run */
    size_t n, depth;
    uint64_t share_epoch; /* the system open_share was counted for (0: none) */
    size_t share_n, share;
};

static void exec_free(struct exec *ex, size_t depth)
{
    for (size_t d = 0; ex && d < depth; d++) {
        free(ex[d].ans);
        free(ex[d].pa);
        free(ex[d].segs);
        free(ex[d].bx);
    }
    free(ex);
}

void fit_cache_free(tpu_model *m)
{
    if (!m->fit_cache)
        return;
    exec_free(m->fit_cache->ex, m->fit_cache->depth);
    free(m->fit_cache);
    m->fit_cache = NULL;
}

static void run_free(struct run *u)
{
    struct fit_cache *k = u->m->fit_cache;
    if (!u->ex)
        return;
    for (size_t d = 0; d < u->depth; d++)
        exec_release(u, &u->ex[d]);
    if (!k && (k = u->m->fit_cache = calloc(1, sizeof *k)) == NULL) {
        exec_free(u->ex, u->depth);
    } else if (!k->ex) { /* kept for the next run */
        k->ex = u->ex;
        k->n = u->n;
        k->depth = u->depth;
    } else {
        exec_free(u->ex, u->depth);
    }
    u->ex = NULL;
}

/* How many cores read their host-side input files on one CPU at once, at
 * worst: the most data connections to one address (the cores of a host, or
 * of several emulated hosts on one machine), over the client's CPUs when that
 * address is this machine's loopback; at least 1. 256 cores on a 2-CPU
 * machine each took 32 s to open Fashion-MNIST's 60,000 rows. */
static size_t open_share(const tpu_cluster *c)
{
    const struct dpio_conn *p = c->coll->peers;
    size_t n = c->coll->n, most = 1;
    const char *most_at = NULL;
    for (size_t i = 0; i < n; i++) {
        const char *ci = strrchr(p[i].addr, ':');
        size_t li = ci ? (size_t)(ci - p[i].addr) : strlen(p[i].addr), same = 0;
        for (size_t j = 0; j < n; j++) {
            const char *cj = strrchr(p[j].addr, ':');
            size_t lj = cj ? (size_t)(cj - p[j].addr) : strlen(p[j].addr);
            same += lj == li && !memcmp(p[i].addr, p[j].addr, li);
        }
        if (same > most)
            most = same, most_at = p[i].addr;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (most_at && cpus > 1 &&
        (!strncmp(most_at, "127.", 4) || !strncmp(most_at, "[::1]", 5) || !strncmp(most_at, "localhost:", 10)))
        most = (most + (size_t)cpus - 1) / (size_t)cpus;
    return most;
}

/* TPUEMU_FANOUT=K (2..16; default 4, 0: off) and TPUEMU_FANOUT_MIN=N
 * (default 16): with host-side input on N cores or more, each execution's
 * request goes to replica 0 only and fans out down a K-ary tree of cores
 * (docs/design/fanout.md). The degree for n cores, 0 for none. */
static int fanout_degree(size_t n, uint32_t *out, err *e)
{
    const char *names[2] = {"TPUEMU_FANOUT", "TPUEMU_FANOUT_MIN"};
    unsigned long v[2] = {4, 16};
    for (int i = 0; i < 2; i++) {
        const char *s = getenv(names[i]);
        char *end;
        if (!s || !*s)
            continue;
        v[i] = strtoul(s, &end, 10);
        if (*end || *s == '-' || (i == 0 && (v[i] == 1 || v[i] > 16)) || (i == 1 && v[i] > 1000000))
            return err_set(e, CODE_INVALID_ARGUMENT, "%s is '%s': %s", names[i], s,
                           i == 0 ? "a tree degree of 2 to 16, or 0 for none" : "a number of cores");
    }
    *out = v[0] && n >= 2 && n >= v[1] ? (uint32_t)v[0] : 0;
    return CODE_OK;
}

static int run_init(struct run *u, tpu_model *m, int mode, err *e)
{
    memset(u, 0, sizeof *u);
    u->m = m;
    u->mode = mode;
    u->n = m->s->c->coll->n;
    struct fit_cache *k = m->fit_cache;
    uint64_t epoch = m->s->c->coll->epoch;
    if (k && k->share_epoch == epoch && k->share_n == u->n) {
        u->open_share = k->share;
    } else {
        u->open_share = open_share(m->s->c);
        if (k)
            k->share_epoch = epoch, k->share_n = u->n, k->share = u->open_share;
    }
    if (fanout_degree(u->n, &u->fanout, e) != CODE_OK)
        return e->code;
    u->spe = m->co.steps_per_execution;
    u->depth = m->co.infeed_depth;
    u->units = m->units[m->nlayers - 1];
    /* TPUEMU_INFEED_F32=1: float32 all the same (to compare; the results are equal) */
    const char *f32 = getenv("TPUEMU_INFEED_F32");
    u->x_bf16 = m->co.policy == TPU_POLICY_MIXED_BFLOAT16 && lspec_input_bf16(m->spec, (int)m->nlayers) &&
                !(f32 && !strcmp(f32, "1"));
    if (k && k->ex && k->n == u->n && k->depth == u->depth) {
        u->ex = k->ex; /* the last run's */
        k->ex = NULL;
        return CODE_OK;
    }
    if (!(u->ex = calloc(u->depth, sizeof *u->ex)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t d = 0; d < u->depth; d++) {
        struct exec *x = &u->ex[d];
        x->ans = calloc(u->n, sizeof *x->ans);
        x->pa = calloc(u->n, sizeof *x->pa);
        x->segs = calloc(u->n * 2 * TIO_MAX_STEPS, sizeof *x->segs);
        if (!x->ans || !x->pa || !x->segs) {
            run_free(u);
            return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
        }
        for (size_t r = 0; r < u->n; r++)
            x->pa[r] = &x->ans[r];
    }
    return CODE_OK;
}

/* Waits for everything in flight (after an error of the caller's own: the
 * streams stay in step). */
static void drain(struct run *u)
{
    uint64_t t = now_ns();
    err ignored;
    while (u->inflight)
        finish_oldest(u, &t, &ignored);
}

static int check_dataset(const tpu_model *m, tpu_dataset *ds, int need_labels, const char *what, err *e)
{
    size_t n = m->s->c->coll ? m->s->c->coll->n : 0, b;
    if (!ds)
        return err_set(e, CODE_INVALID_ARGUMENT, "%s: no dataset", what);
    if (tpu_dataset_x_dim(ds) != m->in_dim)
        return err_set(e, CODE_INVALID_ARGUMENT, "%s: the dataset's rows have %zu features; the model takes %zu", what,
                       tpu_dataset_x_dim(ds), m->in_dim);
    uint32_t fnum = 0;
    if (dataset_files(ds, &fnum, NULL) && fnum != n)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "%s: the dataset was distributed from files over %u replicas; the "
                       "system has %zu: distribute it again",
                       what, (unsigned)fnum, n);
    if (!(b = tpu_dataset_batch_size(ds)))
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "%s: the dataset is not batched; batch it (tpu_dataset_batch) with a global batch of 128 x %zu "
                       "replicas = %zu", what, n, 128 * n);
    if (b % n && !m->resharded)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "%s: the global batch of %zu does not split evenly over %zu replicas; use a multiple of %zu "
                       "(128 x %zu = %zu is best)", what, b, n, n, n, 128 * n);
    if (need_labels) {
        tpu_label_kind lk = tpu_dataset_label_kind(ds);
        if (m->co.loss == TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY && lk != TPU_LABELS_SPARSE)
            return err_set(e, CODE_INVALID_ARGUMENT, "%s: sparse categorical cross-entropy needs int32 class ids "
                           "(TPU_LABELS_SPARSE)", what);
        if (m->co.loss != TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY &&
            (lk != TPU_LABELS_DENSE || tpu_dataset_y_dim(ds) != m->units[m->nlayers - 1]))
            return err_set(e, CODE_INVALID_ARGUMENT, "%s: this loss needs labels of %zu floats per row (TPU_LABELS_DENSE)",
                           what, m->units[m->nlayers - 1]);
    }
    return CODE_OK;
}

static void warn_batch(tpu_model *m, size_t b)
{
    size_t n = m->s->c->coll->n, per = b / n;
    if (m->warned_batch == b)
        return;
    m->warned_batch = b;
    if (per % 8 || b % 128)
        cli_warn("global batch %zu (%zu per core on %zu cores) is not a multiple of 8 per core and 128 overall: "
                 "the MXU's 128x128 tiles run partly empty; use 128 x %zu = %zu", b, per, n, n, 128 * n);
}

static double nan_or(int have, double v)
{
    return have ? v : NAN;
}

struct elastic;
static int elastic_after_step(tpu_model *m, const tpu_fit_options *o, struct elastic *el, err *e);
static int elastic_growing(const struct elastic *el);

/* One pass over one epoch of ds in mode; callbacks only for training (el:
 * elastic training's, or NULL). */
static int run_epoch(tpu_model *m, tpu_dataset *ds, int mode, int epoch, size_t skip, const tpu_fit_options *o,
                     struct elastic *el, tpu_logs *logs, float *out, size_t out_rows, size_t *rows_out, int *stop,
                     err *e)
{
    struct run u;
    int rc;
    uint64_t t0 = now_ns(), tl = t0;
    int acc = m->co.metrics_accuracy && m->co.loss != TPU_LOSS_MEAN_SQUARED_ERROR;

    if ((rc = run_init(&u, m, mode, e)) != CODE_OK)
        return rc;
    u.out = out;
    u.out_rows = out_rows;
    u.epoch = (uint64_t)epoch;
    {
        int on_hosts = 0;
        const struct hin_spec *hs = dataset_files(ds, &u.hin_num, &on_hosts);
        u.hin = hs && on_hosts ? hs : NULL;
    }
    if (tpu_dataset_iter_new(ds, (uint64_t)epoch, skip, &u.it) != TPU_OK) {
        run_free(&u);
        return err_set(e, (int)tpu_last_status(), "%s", tpu_last_error());
    }
    size_t nb = tpu_dataset_num_batches(ds);
    logs->batches = nb;
    logs->epoch = epoch;
    u.batches_done = skip;
    rc = CODE_OK;
    while (rc == CODE_OK) {
        if (cli_cancel_requested(&m->s->c->cancel))
            stop_cleanly(&u);
        while (!u.eof && u.inflight < u.depth && rc == CODE_OK) {
            /* not past the last batch: the end of the epoch is found by the read after it */
            for (size_t i = 0; i < o->num_callbacks && rc == CODE_OK && u.batches_done + u.inflight < nb; i++)
                if (o->callbacks[i].on_batch_begin) {
                    tpu_status cs = o->callbacks[i].on_batch_begin(m, epoch, u.batches_done + u.inflight,
                                                                   o->callbacks[i].user);
                    if (cs == TPU_CANCELLED)
                        *stop = 1, u.eof = 1;
                    else if (cs != TPU_OK)
                        rc = err_set(e, (int)cs, "a callback stopped training: %s", tpu_last_error());
                }
            if (rc == CODE_OK && !u.eof)
                rc = post_next(&u, e);
        }
        if (rc != CODE_OK || !u.inflight)
            break;
        if ((rc = finish_oldest(&u, &tl, e)) != CODE_OK)
            break;
        /* a notice: no more steps are posted; those in flight finish on every
         * replica alike, so all of them stop at the same step boundary */
        if (mode == TPU_STEP_TRAIN && !el && o->preemption_checkpoint && m->notice.kind != TPU_NOTICE_NONE && !*stop) {
            *stop = 2;
            u.eof = 1;
        }
        /* elastic: a notice or the step of a snapshot (where lost cores
         * that are back are taken back: nothing more is posted) */
        if (el && (rc = elastic_after_step(m, o, el, e)) != CODE_OK)
            break;
        if (el && elastic_growing(el))
            u.eof = 1;
        logs->loss = u.rows ? u.loss_sum / (double)u.rows : NAN;
        logs->accuracy = nan_or(acc && u.rows, u.rows ? (double)u.correct / (double)u.rows : 0);
        logs->batch = u.batches_done;
        logs->step = m->step;
        logs->elapsed_s = (double)(now_ns() - t0) / 1e9;
        logs->examples_per_s = logs->elapsed_s > 0 ? (double)u.rows / logs->elapsed_s : 0;
        for (size_t i = 0; i < o->num_callbacks && rc == CODE_OK; i++)
            if (o->callbacks[i].on_batch_end) {
                tpu_status cs = o->callbacks[i].on_batch_end(m, epoch, u.batches_done - 1, logs, o->callbacks[i].user);
                if (cs == TPU_CANCELLED)
                    *stop = 1, u.eof = 1;
                else if (cs != TPU_OK)
                    rc = err_set(e, (int)cs, "a callback stopped training: %s", tpu_last_error());
            }
    }
    if (rc != CODE_OK)
        drain(&u);
    if (rc == CODE_OK && u.cancelled)
        rc = err_set(e, CODE_CANCELLED, "the call was cancelled (tpu_cancel) after step %llu (epoch %d, batch %zu): "
                     "every replica stopped there, and the model can go on from there",
                     (unsigned long long)m->step, epoch + 1, u.batches_done);
    if (rows_out)
        *rows_out = u.out_put;
    tpu_dataset_iter_free(u.it);
    run_free(&u);
    return rc;
}

static int callbacks_call(const tpu_fit_options *o, tpu_model *m, int which, int epoch, const tpu_logs *logs,
                          int *stop, err *e)
{
    for (size_t i = 0; i < o->num_callbacks; i++) {
        const tpu_callback *cb = &o->callbacks[i];
        tpu_status cs = TPU_OK;
        if (which == 0 && cb->on_train_begin)
            cs = cb->on_train_begin(m, cb->user);
        else if (which == 1 && cb->on_epoch_begin)
            cs = cb->on_epoch_begin(m, epoch, cb->user);
        else if (which == 2 && cb->on_epoch_end)
            cs = cb->on_epoch_end(m, epoch, logs, cb->user);
        else if (which == 3 && cb->on_train_end)
            cs = cb->on_train_end(m, logs, cb->user);
        if (cs == TPU_CANCELLED)
            *stop = 1;
        else if (cs != TPU_OK)
            return err_set(e, (int)cs, "a callback stopped training: %s", tpu_last_error());
    }
    return CODE_OK;
}

static int prepare(tpu_model *m, tpu_dataset *ds, tpu_dataset *val, int labels, const char *what, err *e)
{
    size_t b;
    if (!m->configured)
        return err_set(e, CODE_FAILED_PRECONDITION, "%s: compile the model first (tpu_model_compile)", what);
    if (!m->s->c->coll || !m->s->c->coll->n)
        return err_set(e, CODE_FAILED_PRECONDITION, "%s: no TPU system; initialize it first", what);
    if (check_dataset(m, ds, labels, what, e) != CODE_OK)
        return e->code;
    b = tpu_dataset_batch_size(ds);
    if (val) {
        if (check_dataset(m, val, 1, "validation data", e) != CODE_OK)
            return e->code;
        if (tpu_dataset_batch_size(val) > b)
            b = tpu_dataset_batch_size(val);
    }
    warn_batch(m, tpu_dataset_batch_size(ds));
    return model_ensure_compiled(m, b, e);
}

/* ---- elastic training ---- */

#define ELASTIC_WAIT_MS 30000u
#define ELASTIC_SNAPSHOT_STEPS 50u
#define ELASTIC_INIT_MS 15000u      /* one initialize of the system again */
#define ELASTIC_SETTLE_MS 30000u    /* after the wait: for silent cores to be declared dead */

struct elastic {
    const tpu_elastic_options *o;
    tpu_history *h;
    struct model_snap snap;     /* the newest state in memory */
    int noticed;                /* the current notice is handled */
    int losses;
    size_t n0;                  /* replicas when fit began */
    size_t gb0;                 /* the dataset's batch when fit began */
    size_t gb;                  /* and now */
    int grow_to;                /* replicas to grow back to at this step boundary; 0: none */
};

static int elastic_growing(const struct elastic *el)
{
    return el->grow_to > 0;
}

static uint64_t now_ms(void)
{
    return now_ns() / 1000000u;
}

/* src cut to fit, as a string */
static void copy_str(char *dst, size_t n, const char *src)
{
    size_t k = strlen(src);
    if (k >= n)
        k = n - 1;
    memcpy(dst, src, k);
    dst[k] = 0;
}

static void core_name(const tpu_model *m, int replica, char *buf, size_t n)
{
    const struct cli_coll *cc = m->s->c->coll;
    if (cc && replica >= 0 && (size_t)replica < cc->n)
        snprintf(buf, n, "%s/%d", cc->peers[replica].host, cc->peers[replica].core);
    else
        snprintf(buf, n, "?");
}

static int history_add_event(tpu_history *h, const tpu_elastic_event *ev, err *e)
{
    if (h->nev == h->capev) {
        size_t cap = h->capev ? 2 * h->capev : 8;
        tpu_elastic_event *ne = realloc(h->ev, cap * sizeof *ne);
        if (!ne)
            return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
        h->ev = ne;
        h->capev = cap;
    }
    h->ev[h->nev++] = *ev;
    return CODE_OK;
}

static int elastic_snapshot(tpu_model *m, struct elastic *el, err *e)
{
    struct model_snap sn;
    int rc = model_snap_take(m, &sn, e);
    if (rc != CODE_OK)
        return rc;
    model_snap_free(&el->snap);
    el->snap = sn;
    return CODE_OK;
}

/* After each answered execution: a new notice is a snapshot (and the
 * preemption checkpoint) at this step boundary; else every snapshot_steps
 * steps a snapshot. A failure here is a failure of the step. */
static int count_live(tpu_cluster *c, int *silent, uint64_t *silence_ms);

static int elastic_after_step(tpu_model *m, const tpu_fit_options *o, struct elastic *el, err *e)
{
    uint64_t every = el->o->snapshot_steps ? el->o->snapshot_steps : ELASTIC_SNAPSHOT_STEPS;
    int rc;

    if (m->notice.kind == TPU_NOTICE_NONE) {
        el->noticed = 0;
    } else if (!el->noticed) {
        tpu_elastic_event ev;
        char who[DPIO_HOST_MAX + 16];
        el->noticed = 1;
        core_name(m, m->notice_replica, who, sizeof who);
        if ((rc = elastic_snapshot(m, el, e)) != CODE_OK)
            return rc;
        memset(&ev, 0, sizeof ev);
        ev.kind = TPU_ELASTIC_NOTICE;
        ev.step = ev.restored_step = el->snap.step;
        ev.replicas_before = ev.replicas_after = (int)m->s->c->coll->n;
        ev.global_batch_before = ev.global_batch_after = el->gb;
        snprintf(ev.from, sizeof ev.from, "memory");
        if (o->preemption_checkpoint) {
            if (tpu_model_save_checkpoint(m, o->preemption_checkpoint) != TPU_OK)
                return err_set(e, (int)tpu_last_status(), "saving the preemption checkpoint: %s", tpu_last_error());
            snprintf(ev.from, sizeof ev.from, "%s", o->preemption_checkpoint);
        }
        snprintf(ev.cause, sizeof ev.cause, "a %s notice came from core %s (the event in %.1f s)",
                 m->notice.kind == TPU_NOTICE_PREEMPTION ? "preemption" : "maintenance", who,
                 (double)m->notice.event_in_ms / 1000.0);
        cli_warn("elastic training: %s: state saved after step %llu (%s); training goes on until the event",
                 ev.cause, (unsigned long long)ev.step, ev.from);
        return history_add_event(el->h, &ev, e);
    }
    if (m->step < el->snap.step + every)
        return CODE_OK;
    if ((rc = elastic_snapshot(m, el, e)) != CODE_OK)
        return rc;
    /* a fit that shrank: lost cores back (live, and not in the system) are
     * taken back here, up to the replicas fit began with */
    size_t n = m->s->c->coll->n;
    if (n < el->n0) {
        int silent;
        uint64_t silence;
        int live = count_live(m->s->c, &silent, &silence);
        if (live > (int)n)
            el->grow_to = live < (int)el->n0 ? live : (int)el->n0;
    }
    return CODE_OK;
}

/* Live cores (IDLE or READY, a heartbeat within the resolver's dead-core
 * time) and silent ones (IDLE or READY with an older heartbeat: dying or
 * hung, about to be declared dead). -1 when the resolver does not answer.
 * *silence_ms gets the dead-core time. */
static int count_live(tpu_cluster *c, int *silent, uint64_t *silence_ms)
{
    tpu_cluster_spec *sp;
    int live = 0;
    *silent = 0;
    if (tpu_cluster_spec_get(c, &sp) != TPU_OK)
        return -1;
    *silence_ms = (uint64_t)tpu_cluster_spec_heartbeat_ms(sp) * (tpu_cluster_spec_dead_after(sp) + 1);
    for (size_t i = 0; i < tpu_cluster_spec_num_cores(sp); i++) {
        tpu_core_info ci;
        if (tpu_cluster_spec_core(sp, i, &ci) != TPU_OK ||
            (ci.state != TPU_CORE_IDLE && ci.state != TPU_CORE_READY))
            continue;
        if (ci.heartbeat_age_ms <= *silence_ms)
            live++;
        else
            (*silent)++;
    }
    tpu_cluster_spec_free(sp);
    return live;
}

/* One initialize of want cores; TPU_OK or the status (having kept its message in why). */
static tpu_status elastic_init(tpu_cluster *c, int want, char *why, size_t n)
{
    tpu_init_options io = {.expect = (uint32_t)want, .timeout_ms = ELASTIC_INIT_MS,
                          .keep_scheduled_faults = 1}; /* the same run: its steps go on */
    tpu_topology *t = NULL;
    tpu_status st = cli_initialize_system(c, &io, &t, 1); /* the state is restored below */
    if (st == TPU_OK)
        tpu_topology_free(t);
    else
        snprintf(why, n, "%s: %s", tpu_status_name(st), tpu_last_error());
    return st;
}

/* After a loss (cause): the TPU system again, with every replica when they
 * are back within wait_ms, else with the live cores; the model compiled onto
 * it from the newest state, re-sharded; the event in the history. */
static int elastic_recover(tpu_model *m, tpu_dataset *ds, struct elastic *el, const char *cause, err *e)
{
    const tpu_elastic_options *eo = el->o;
    tpu_cluster *c = m->s->c;
    uint64_t t0 = now_ms(), silence = 4000, wait = eo->wait_ms ? eo->wait_ms : ELASTIC_WAIT_MS;
    uint64_t deadline = t0 + wait, settle = deadline + ELASTIC_SETTLE_MS;
    int before = (int)c->coll->n, want = before, min = eo->min_replicas > 0 ? eo->min_replicas : 1;
    int live = 0, silent = 0, got = 0;
    size_t gb_before = tpu_dataset_batch_size(ds);
    uint64_t step_lost = m->step;
    char why[ERR_MSG_MAX] = "", from[sizeof ((tpu_elastic_event *)0)->from] = "memory";
    tpu_elastic_event ev;

    el->grow_to = 0; /* a loss first: the cores are counted again */
    cli_warn("elastic training: %s; waiting up to %.1f s for %d live cores", cause, (double)wait / 1000.0, want);
    /* every replica back in time: the same system again */
    for (int tries = 0; !got && tries < 100000; tries++) {
        uint64_t now = now_ms();
        live = count_live(c, &silent, &silence);
        /* first the resolver's dead-core time, so that a core that has just
         * died is listed dead (an initialize would wait for it in vain) */
        if (live >= want && now - t0 >= silence) {
            if (elastic_init(c, want, why, sizeof why) == TPU_OK)
                got = want;
        }
        if (got || now_ms() >= deadline)
            break;
        if (cli_sleep(c, 200, "elastic training's wait for the cores", e) != CODE_OK)
            return e->code;
    }
    char first_why[ERR_MSG_MAX / 2];
    copy_str(first_why, sizeof first_why, why);
    /* else the live cores, once the silent ones are declared dead */
    for (int tries = 0; !got && tries < 100000; tries++) {
        uint64_t now = now_ms();
        live = count_live(c, &silent, &silence);
        if (live >= min && (!silent || now >= settle)) {
            int k = live < want ? live : want; /* never more than the system had */
            if (elastic_init(c, k, why, sizeof why) == TPU_OK)
                got = k;
        }
        if (got || now_ms() >= settle + ELASTIC_INIT_MS)
            break;
        if (cli_sleep(c, 200, "elastic training's wait for the cores", e) != CODE_OK)
            return e->code;
    }
    if (!got) {
        if (live < 0)
            return err_set(e, CODE_UNAVAILABLE, "elastic training: after %s, the resolver does not answer: %s", cause,
                           why[0] ? why : tpu_last_error());
        return err_set(e, CODE_UNAVAILABLE, "elastic training: after %s, %d live cores %s(min_replicas %d)%s%s",
                       cause, live, live < min ? "are too few " : "could not be initialized ", min,
                       why[0] ? ": " : "", why);
    }
    int n = (int)c->coll->n;
    size_t gb = gb_before;
    if (eo->batch == TPU_ELASTIC_KEEP_PER_REPLICA_BATCH && n != before) {
        gb = gb_before / (size_t)before * (size_t)n;
        int rc = dataset_rebatch(ds, gb, e);
        if (rc != CODE_OK)
            return err_prefix(e, "elastic training: re-sharding the dataset to a global batch of %zu", gb), rc;
    }
    if ((size_t)n != el->n0 || gb != el->gb0)
        m->resharded = 1;
    el->gb = gb;

    /* the newest state, from now on the one to go back to: the checkpoint
     * file when it is ahead of the snapshot */
    if (eo->checkpoint && access(eo->checkpoint, F_OK) == 0) {
        struct model_snap fsn;
        err fe;
        if (model_snap_read(m, eo->checkpoint, &fsn, &fe) != CODE_OK) {
            cli_warn("elastic training: %s (the snapshot in memory is used)", fe.msg);
        } else if (fsn.step > el->snap.step) {
            model_snap_free(&el->snap);
            el->snap = fsn;
            snprintf(from, sizeof from, "%s", eo->checkpoint);
        } else {
            model_snap_free(&fsn);
        }
    }
    if (gb != gb_before) /* the position counted in batches of the old size */
        el->snap.batch = el->snap.batch * gb_before / gb;
    int rc = model_snap_apply(m, &el->snap, e);
    if (rc == CODE_OK)
        rc = model_ensure_compiled(m, gb, e);
    if (rc != CODE_OK)
        return err_prefix(e, "elastic training: restoring the state on %d replicas", n), rc;

    memset(&ev, 0, sizeof ev);
    ev.kind = n == before ? TPU_ELASTIC_RESTORED : TPU_ELASTIC_SHRUNK;
    ev.step = step_lost;
    snprintf(ev.from, sizeof ev.from, "%s", from);
    ev.restored_step = el->snap.step;
    ev.replicas_before = before;
    ev.replicas_after = n;
    ev.global_batch_before = gb_before;
    ev.global_batch_after = gb;
    ev.seconds = (double)(now_ms() - t0) / 1000.0;
    copy_str(ev.cause, sizeof ev.cause, cause);
    if (n == before)
        cli_warn("elastic training: restored with %d replicas, global batch %zu, from step %llu (%s) after %.1f s", n,
                 gb, (unsigned long long)el->snap.step, ev.from, ev.seconds);
    else
        cli_warn("elastic training: went on with %d replicas (was %d), global batch %zu, from step %llu (%s) after "
                 "%.1f s: %d core%s not back within %.1f s%s%s", n, before, gb, (unsigned long long)el->snap.step,
                 ev.from, ev.seconds, before - n, before - n == 1 ? " was" : "s were", (double)wait / 1000.0,
                 first_why[0] ? "; " : "", first_why);
    return history_add_event(el->h, &ev, e);
}

/* At a step boundary of a fit that shrank, with nothing in flight: the TPU
 * system again with el->grow_to cores (the lost ones back), the model
 * compiled onto it from the state at this step, re-sharded as when it shrank;
 * a GREW event. When the cores cannot be had after all, the system as it was. */
static int elastic_grow(tpu_model *m, tpu_dataset *ds, struct elastic *el, err *e)
{
    tpu_cluster *c = m->s->c;
    int before = (int)c->coll->n, want = el->grow_to;
    size_t gb_before = tpu_dataset_batch_size(ds), gb = gb_before;
    uint64_t t0 = now_ms();
    char why[ERR_MSG_MAX] = "", (*had)[DPIO_HOST_MAX + 16];
    tpu_elastic_event ev;
    int rc;

    el->grow_to = 0;
    if ((rc = elastic_snapshot(m, el, e)) != CODE_OK)
        return rc;
    if (!(had = calloc((size_t)before, sizeof *had)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    for (int r = 0; r < before; r++)
        core_name(m, r, had[r], sizeof had[r]);
    if (elastic_init(c, want, why, sizeof why) != TPU_OK) {
        free(had);
        cli_warn("elastic training: growing back to %d replicas failed (%s); going on with %d", want, why, before);
        if (elastic_init(c, before, why, sizeof why) != TPU_OK)
            return err_set(e, CODE_UNAVAILABLE,
                           "elastic training: after growing back to %d replicas failed, "
                           "the %d replicas could not be initialized again: %s",
                           want, before, why);
        if ((rc = model_snap_apply(m, &el->snap, e)) == CODE_OK)
            rc = model_ensure_compiled(m, gb, e);
        return rc != CODE_OK ? err_prefix(e, "elastic training: restoring the state on %d replicas", before),
               rc            : CODE_OK;
    }
    int n = (int)c->coll->n;
    memset(&ev, 0, sizeof ev);
    for (int r = 0; r < n; r++) { /* the cores that came back, by name */
        char who[DPIO_HOST_MAX + 16];
        int old = 0;
        core_name(m, r, who, sizeof who);
        for (int k = 0; k < before && !old; k++)
            old = strcmp(who, had[k]) == 0;
        size_t len = strlen(ev.cause);
        if (!old && len + strlen(who) + 32 < sizeof ev.cause)
            snprintf(ev.cause + len, sizeof ev.cause - len, "%s%s", len ? ", " : "core ", who);
    }
    free(had);
    snprintf(ev.cause + strlen(ev.cause), sizeof ev.cause - strlen(ev.cause), " %s back",
             n - before == 1 ? "is" : "are");
    if (el->o->batch == TPU_ELASTIC_KEEP_PER_REPLICA_BATCH) {
        gb = n == (int)el->n0 ? el->gb0 : gb_before / (size_t)before * (size_t)n;
        if (gb != gb_before && (rc = dataset_rebatch(ds, gb, e)) != CODE_OK)
            return err_prefix(e, "elastic training: re-sharding the dataset to a global batch of %zu", gb), rc;
    }
    if (gb != gb_before) /* the position counted in batches of the old size */
        el->snap.batch = el->snap.batch * gb_before / gb;
    el->gb = gb;
    if ((rc = model_snap_apply(m, &el->snap, e)) == CODE_OK)
        rc = model_ensure_compiled(m, gb, e);
    if (rc != CODE_OK)
        return err_prefix(e, "elastic training: restoring the state on %d replicas", n), rc;
    ev.kind = TPU_ELASTIC_GREW;
    ev.step = ev.restored_step = el->snap.step;
    snprintf(ev.from, sizeof ev.from, "memory");
    ev.replicas_before = before;
    ev.replicas_after = n;
    ev.global_batch_before = gb_before;
    ev.global_batch_after = gb;
    ev.seconds = (double)(now_ms() - t0) / 1000.0;
    cli_warn("elastic training: grew back to %d replicas (was %d), global batch %zu, at step %llu after %.1f s: %s", n,
             before, gb, (unsigned long long)ev.step, ev.seconds, ev.cause);
    return history_add_event(el->h, &ev, e);
}

static int elastic_check(const tpu_fit_options *o, tpu_model *m, tpu_dataset *ds, err *e)
{
    const tpu_elastic_options *eo = &o->elastic;
    size_t n = m->s->c->coll->n;
    if (eo->max_losses < 0 || eo->max_losses > 1000)
        return err_set(e, CODE_INVALID_ARGUMENT, "elastic.max_losses %d is outside 0..1000", eo->max_losses);
    if (!eo->max_losses)
        return CODE_OK;
    if (dataset_files(ds, NULL, NULL))
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "elastic training re-shards the dataset over the cores left; a "
                       "dataset distributed from files has one input pipeline per replica of the system it was "
                       "distributed for: train it without elastic (with a checkpoint to recover from), or elastically "
                       "on a client-fed dataset");
    if (eo->wait_ms > 3600000u)
        return err_set(e, CODE_INVALID_ARGUMENT, "elastic.wait_ms %u is more than 3600000 (an hour)", eo->wait_ms);
    if (eo->min_replicas < 0 || (size_t)eo->min_replicas > n)
        return err_set(e, CODE_INVALID_ARGUMENT, "elastic.min_replicas %d is outside 0..%zu (the replicas now)",
                       eo->min_replicas, n);
    if ((unsigned)eo->batch > TPU_ELASTIC_KEEP_PER_REPLICA_BATCH)
        return err_set(e, CODE_INVALID_ARGUMENT, "elastic.batch %d is not a tpu_elastic_batch", (int)eo->batch);
    if (eo->checkpoint && !*eo->checkpoint)
        return err_set(e, CODE_INVALID_ARGUMENT, "elastic.checkpoint is an empty path");
    if (eo->batch == TPU_ELASTIC_KEEP_PER_REPLICA_BATCH &&
        dataset_rebatch(ds, tpu_dataset_batch_size(ds), e) != CODE_OK) /* changes nothing; can it be re-batched? */
        return err_prefix(e, "elastic.batch TPU_ELASTIC_KEEP_PER_REPLICA_BATCH"), e->code;
    return CODE_OK;
}

static int is_loss(int code)
{
    return code == CODE_UNAVAILABLE || code == CODE_DEADLINE_EXCEEDED;
}

/* ---- fit ---- */

/* Epochs [start, o->epochs), the first from batch skip: until done, a stop
 * (*stop: 1 by a callback, 2 by a notice) or a failure. */
static int train_epochs(tpu_model *m, tpu_dataset *ds, const tpu_fit_options *o, struct elastic *el, tpu_history *h,
                        int start, size_t skip, tpu_logs *logs, int *stop, err *e)
{
    int rc = CODE_OK;
    for (int ep = start; rc == CODE_OK && !*stop && ep < o->epochs; ep++) {
        memset(logs, 0, sizeof *logs);
        m->cur_epoch = ep;
        if ((rc = callbacks_call(o, m, 1, ep, NULL, stop, e)) != CODE_OK || *stop)
            break;
        rc = run_epoch(m, ds, TPU_STEP_TRAIN, ep, ep == start ? skip : 0, o, el, logs, NULL, 0, NULL, stop, e);
        if (rc != CODE_OK)
            break;
        if (el && el->grow_to && logs->batch < logs->batches)
            return CODE_ABORTED; /* in the middle of the epoch: grown, it goes on from this batch */
        if (*stop == 2)
            break; /* a notice: the checkpoint is saved by the caller */
        if (o->validation_data) {
            tpu_logs vl;
            tpu_fit_options vo = *o; /* fit's callbacks see training batches only */
            vo.callbacks = NULL;
            vo.num_callbacks = 0;
            memset(&vl, 0, sizeof vl);
            if ((rc = run_epoch(m, o->validation_data, TPU_STEP_EVALUATE, 0, 0, &vo, NULL, &vl, NULL, 0, NULL, stop,
                                e)) != CODE_OK)
                break;
            logs->has_val = 1;
            logs->val_loss = vl.loss;
            logs->val_accuracy = vl.accuracy;
        }
        if (logs->batch >= logs->batches) {
            m->cur_epoch = ep + 1;
            m->cur_batch = 0;
        }
        while (h->n && h->e[h->n - 1].epoch >= ep) /* trained again after an elastic restore */
            h->n--;
        if (h->n == h->cap) {
            size_t cap = h->cap ? 2 * h->cap : 16;
            tpu_logs *ne = realloc(h->e, cap * sizeof *ne);
            if (!ne) {
                rc = err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
                break;
            }
            h->e = ne;
            h->cap = cap;
        }
        h->e[h->n++] = *logs;
        if ((rc = callbacks_call(o, m, 2, ep, logs, stop, e)) != CODE_OK)
            break;
        if (el && el->grow_to && ep + 1 >= o->epochs)
            el->grow_to = 0; /* the last epoch is done: nothing to grow for */
        if (el && el->grow_to)
            return CODE_ABORTED; /* grown, it goes on with the next epoch */
    }
    return rc;
}

tpu_status tpu_model_fit(tpu_model *m, tpu_dataset *ds, const tpu_fit_options *o, tpu_history **history)
{
    tpu_fit_options def;
    tpu_history *h = NULL;
    tpu_logs logs;
    struct elastic elastic, *el = NULL;
    err e;
    int rc, stop = 0;

    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    CLI_CALL(m->s->c);
    if (history)
        *history = NULL;
    if (!o) {
        memset(&def, 0, sizeof def);
        def.epochs = 1;
        o = &def;
    }
    if (o->epochs < 0 || o->initial_epoch < 0 || o->epochs > HISTORY_MAX)
        return cli_failf(TPU_INVALID_ARGUMENT, "epochs %d / initial_epoch %d: both must be in 0..%d", o->epochs,
                         o->initial_epoch, HISTORY_MAX);
    if (o->num_callbacks && !o->callbacks)
        return cli_failf(TPU_INVALID_ARGUMENT, "num_callbacks %zu with no callbacks", o->num_callbacks);
    if ((rc = prepare(m, ds, o->validation_data, 1, "fit", &e)) != CODE_OK)
        return cli_fail(&e);
    if ((rc = elastic_check(o, m, ds, &e)) != CODE_OK)
        return cli_fail(&e);
    if (!(h = calloc(1, sizeof *h)))
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    m->fit_epochs = o->epochs;
    int start = o->resume ? m->cur_epoch : o->initial_epoch;
    size_t skip = o->resume ? m->cur_batch : 0;
    /* a restored position must lie inside this run */
    if (o->resume && (start > o->epochs || skip > tpu_dataset_num_batches(ds))) {
        tpu_history_free(h);
        return cli_failf(TPU_OUT_OF_RANGE, "resume: the model's position (epoch %d, batch %zu) lies outside this "
                         "run of %d epochs of %zu batches; was the checkpoint written by another run?",
                         start + 1, skip, o->epochs, tpu_dataset_num_batches(ds));
    }
    if (!o->resume) {
        m->cur_epoch = start;
        m->cur_batch = 0;
    }
    if (o->elastic.max_losses) {
        memset(&elastic, 0, sizeof elastic);
        el = &elastic;
        el->o = &o->elastic;
        el->h = h;
        el->n0 = m->s->c->coll->n;
        el->gb0 = el->gb = tpu_dataset_batch_size(ds);
        if ((rc = elastic_snapshot(m, el, &e)) != CODE_OK) {
            tpu_history_free(h);
            return cli_fail(&e);
        }
    }
    memset(&logs, 0, sizeof logs);
    rc = callbacks_call(o, m, 0, start, &logs, &stop, &e);
    while (rc == CODE_OK) {
        if (skip >= tpu_dataset_num_batches(ds)) { /* saved at the very end of an epoch */
            start++;
            skip = 0;
            m->cur_epoch = start;
            m->cur_batch = 0;
        }
        rc = train_epochs(m, ds, o, el, h, start, skip, &logs, &stop, &e);
        if (rc == CODE_ABORTED && el && el->grow_to) { /* lost cores back: taken back */
            if ((rc = elastic_grow(m, ds, el, &e)) == CODE_OK) {
                start = m->cur_epoch;
                skip = m->cur_batch;
                continue;
            }
        }
        if (rc == CODE_OK || !el || !is_loss(rc))
            break;
        if (el->losses >= el->o->max_losses) {
            err_prefix(&e, "elastic training gave up after %d losses (max_losses %d)", el->losses,
                       el->o->max_losses);
            break;
        }
        el->losses++;
        char cause[ERR_MSG_MAX + 32];
        snprintf(cause, sizeof cause, "%s: %s", code_name(e.code), e.msg);
        if ((rc = elastic_recover(m, ds, el, cause, &e)) != CODE_OK)
            break;
        start = m->cur_epoch;
        skip = m->cur_batch;
    }
    if (el) {
        model_snap_free(&el->snap);
        if (tpu_dataset_batch_size(ds) != el->gb0) { /* the caller's pipeline as it was */
            err ignored;
            m->cur_batch = m->cur_batch * tpu_dataset_batch_size(ds) / el->gb0;
            dataset_rebatch(ds, el->gb0, &ignored);
        }
    }
    if (rc == CODE_OK && stop == 2) {
        char who[DPIO_HOST_MAX + 16];
        tpu_notice nt = m->notice;
        core_name(m, m->notice_replica, who, sizeof who);
        if (tpu_model_save_checkpoint(m, o->preemption_checkpoint) != TPU_OK)
            rc = err_set(&e, (int)tpu_last_status(), "a %s notice came from core %s and the checkpoint could not be "
                         "saved: %s", nt.kind == TPU_NOTICE_PREEMPTION ? "preemption" : "maintenance", who,
                         tpu_last_error());
        else
            rc = err_set(&e, TPU_PREEMPTED, "a %s notice came from core %s (the event in %.1f s): every replica "
                         "stopped after step %llu (epoch %d, batch %zu) and the checkpoint is saved in %s; start "
                         "again with it (resume) once the cluster is whole",
                         nt.kind == TPU_NOTICE_PREEMPTION ? "preemption" : "maintenance", who,
                         (double)nt.event_in_ms / 1000.0, (unsigned long long)m->step, m->cur_epoch + 1,
                         m->cur_batch, o->preemption_checkpoint);
    }
    if (rc == CODE_OK) {
        int ignored_stop = 0;
        rc = callbacks_call(o, m, 3, m->cur_epoch, &logs, &ignored_stop, &e);
    }
    if (history)
        *history = h;
    else
        tpu_history_free(h);
    return rc == CODE_OK ? TPU_OK : cli_fail(&e);
}

tpu_status tpu_model_notice(const tpu_model *m, tpu_notice *out, int *replica)
{
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_model_notice: out is NULL");
    *out = m->notice;
    if (replica)
        *replica = m->notice_replica;
    return TPU_OK;
}

void tpu_eval_options_init(tpu_eval_options *o)
{
    if (o)
        memset(o, 0, sizeof *o);
}

/* evaluate or predict: one pass over ds, the callbacks around it */
static tpu_status eval_pass(tpu_model *m, tpu_dataset *ds, int mode, const tpu_eval_options *eo, tpu_logs *logs,
                            float *out, size_t out_rows, size_t *got)
{
    const char *what = mode == TPU_STEP_EVALUATE ? "evaluate" : "predict";
    tpu_fit_options o;
    err e;
    int stop = 0, ignored = 0;
    memset(&o, 0, sizeof o);
    memset(logs, 0, sizeof *logs);
    if (eo && eo->num_callbacks && !eo->callbacks)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: num_callbacks is %zu but callbacks is NULL", what,
                         eo->num_callbacks);
    if (eo) {
        o.callbacks = eo->callbacks;
        o.num_callbacks = eo->num_callbacks;
    }
    if (prepare(m, ds, NULL, mode == TPU_STEP_EVALUATE, what, &e) != CODE_OK ||
        callbacks_call(&o, m, 0, 0, logs, &stop, &e) != CODE_OK)
        return cli_fail(&e);
    if (!stop && run_epoch(m, ds, mode, 0, 0, &o, NULL, logs, out, out_rows, got, &stop, &e) != CODE_OK)
        return cli_fail(&e);
    if (mode == TPU_STEP_PREDICT)
        logs->loss = logs->accuracy = NAN;
    if (callbacks_call(&o, m, 3, 0, logs, &ignored, &e) != CODE_OK)
        return cli_fail(&e);
    return TPU_OK;
}

tpu_status tpu_model_evaluate_with(tpu_model *m, tpu_dataset *ds, const tpu_eval_options *o, double *loss,
                                   double *accuracy)
{
    tpu_logs logs;
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    CLI_CALL(m->s->c);
    tpu_status st = eval_pass(m, ds, TPU_STEP_EVALUATE, o, &logs, NULL, 0, NULL);
    if (st != TPU_OK)
        return st;
    if (loss)
        *loss = logs.loss;
    if (accuracy)
        *accuracy = logs.accuracy;
    return TPU_OK;
}

tpu_status tpu_model_evaluate(tpu_model *m, tpu_dataset *ds, double *loss, double *accuracy)
{
    return tpu_model_evaluate_with(m, ds, NULL, loss, accuracy);
}

tpu_status tpu_model_predict_with(tpu_model *m, tpu_dataset *ds, const tpu_eval_options *o, float *out, size_t out_rows,
                                  size_t *rows)
{
    tpu_logs logs;
    size_t got = 0;
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    CLI_CALL(m->s->c);
    if (rows)
        *rows = 0;
    if (!out && out_rows)
        return cli_failf(TPU_INVALID_ARGUMENT, "predict: no output buffer");
    tpu_status st = eval_pass(m, ds, TPU_STEP_PREDICT, o, &logs, out, out_rows, &got);
    if (st != TPU_OK)
        return st;
    if (rows)
        *rows = got;
    return TPU_OK;
}

tpu_status tpu_model_predict(tpu_model *m, tpu_dataset *ds, float *out, size_t out_rows, size_t *rows)
{
    return tpu_model_predict_with(m, ds, NULL, out, out_rows, rows);
}
