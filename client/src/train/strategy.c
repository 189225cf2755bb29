/* Custom training loops, as tf.distribute.TPUStrategy offers them: a
 * distributed dataset (each global batch split into per-replica shards as
 * tf.data's rebatch splits it, or one batch per replica from a dataset
 * function), strategy.run of a built-in step on every core (the STEPS
 * requests fit sends, one step at a time), per-replica values, and
 * strategy.reduce / experimental_local_results on the client. */
#include "model_int.h"

#include "dataset_int.h"
#include "hostin.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAGIC_DIST 0x74707044u    /* "tppD" */
#define MAGIC_DIST_IT 0x74707049u /* "tppI" */
#define MAGIC_PR 0x74707052u      /* "tppR" */

struct tpu_dist_dataset {
    uint32_t magic;
    tpu_strategy *s;
    tpu_dataset *ds;
    int from_fn;            /* 1: ds came from a dataset function (owned; one batch per replica) */
    size_t n;               /* replicas when it was made */
    uint64_t passes;        /* iterators made: the next one's epoch */
    tpu_dist_iter *it;      /* the live iterator, if any */
};

struct tpu_dist_iter {
    uint32_t magic;
    tpu_dist_dataset *dd;
    tpu_dataset_iter *it;
    int done;
};

struct tpu_per_replica {
    uint32_t magic;
    size_t n;
    size_t *rows;           /* n: an input's shard rows; a tensor's first dimension (1 for a scalar) */
    size_t *off;            /* n: first row of each replica in the arrays below */
    size_t total;           /* rows of all replicas */
    int input;
    /* a tensor */
    int rank;               /* 0, 1, 2 */
    size_t cols;            /* rank 2: the second dimension; else 1 */
    double *v;              /* total x cols */
    /* an input */
    size_t x_dim;
    tpu_label_kind lk;
    size_t y_dim, ybytes;   /* ybytes: one row's label bytes (0: none) */
    float *x;               /* total x x_dim */
    uint8_t *y;             /* total x ybytes */
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- per-replica values ---- */

static tpu_per_replica *pr_alloc(size_t n)
{
    tpu_per_replica *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->magic = MAGIC_PR;
    p->n = n;
    p->rows = calloc(n ? n : 1, sizeof *p->rows);
    p->off = calloc(n ? n : 1, sizeof *p->off);
    if (!p->rows || !p->off) {
        free(p->rows);
        free(p->off);
        free(p);
        return NULL;
    }
    p->cols = 1;
    return p;
}

void tpu_per_replica_free(tpu_per_replica *pr)
{
    if (!pr)
        return;
    CHECK_HANDLE(pr, MAGIC_PR, "tpu_per_replica");
    pr->magic = MAGIC_DEAD;
    free(pr->rows);
    free(pr->off);
    free(pr->v);
    free(pr->x);
    free(pr->y);
    free(pr);
}

int tpu_per_replica_num_replicas(const tpu_per_replica *pr)
{
    CHECK_HANDLE(pr, MAGIC_PR, "tpu_per_replica");
    return (int)pr->n;
}

/* A tensor per replica: rank 0 (one value each) or rank 1/2 with rows[r]
 * rows of cols values; values zeroed. */
static tpu_per_replica *pr_tensor(size_t n, int rank, const size_t *rows, size_t cols)
{
    tpu_per_replica *p = pr_alloc(n);
    if (!p)
        return NULL;
    p->rank = rank;
    p->cols = rank == 2 ? cols : 1;
    for (size_t r = 0; r < n; r++) {
        p->rows[r] = rank == 0 ? 1 : rows[r];
        p->off[r] = p->total;
        p->total += p->rows[r];
    }
    if (!(p->v = calloc(p->total * p->cols + 1, sizeof *p->v))) {
        tpu_per_replica_free(p);
        return NULL;
    }
    return p;
}

/* ---- distributed datasets ---- */

static size_t label_bytes(const tpu_dataset *ds)
{
    switch (tpu_dataset_label_kind(ds)) {
    case TPU_LABELS_SPARSE: return sizeof(int32_t);
    case TPU_LABELS_DENSE: return sizeof(float) * tpu_dataset_y_dim(ds);
    case TPU_LABELS_NONE: break;
    }
    return 0;
}

static tpu_status dist_new(tpu_strategy *s, tpu_dataset *ds, int from_fn, tpu_dist_dataset **out)
{
    tpu_dist_dataset *d = calloc(1, sizeof *d);
    if (!d)
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    d->magic = MAGIC_DIST;
    d->s = s;
    d->ds = ds;
    d->from_fn = from_fn;
    d->n = s->c->coll->n;
    *out = d;
    return TPU_OK;
}

tpu_status tpu_strategy_experimental_distribute_dataset(tpu_strategy *s, tpu_dataset *ds, tpu_dist_dataset **out)
{
    CHECK_HANDLE(s, MAGIC_STRATEGY, "tpu_strategy");
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "experimental_distribute_dataset: out is NULL");
    *out = NULL;
    if (!ds)
        return cli_failf(TPU_INVALID_ARGUMENT, "experimental_distribute_dataset: no dataset");
    if (!s->c->coll || !s->c->coll->n)
        return cli_failf(TPU_FAILED_PRECONDITION, "experimental_distribute_dataset: no TPU system; initialize it first");
    if (!tpu_dataset_batch_size(ds))
        return cli_failf(TPU_INVALID_ARGUMENT,
                         "experimental_distribute_dataset: the dataset is not batched; batch it (tpu_dataset_batch) "
                         "with the global batch, e.g. 128 x %zu replicas = %zu", s->c->coll->n, 128 * s->c->coll->n);
    return dist_new(s, ds, 0, out);
}

size_t tpu_input_context_per_replica_batch_size(const tpu_input_context *ctx, size_t global_batch)
{
    if (!ctx || ctx->num_replicas_in_sync < 1) {
        cli_failf(TPU_INVALID_ARGUMENT, "get_per_replica_batch_size: no input context");
        return 0;
    }
    if (global_batch % (size_t)ctx->num_replicas_in_sync) {
        cli_failf(TPU_INVALID_ARGUMENT, "get_per_replica_batch_size: the global batch size (%zu) is not divisible "
                  "by num_replicas_in_sync (%d)", global_batch, ctx->num_replicas_in_sync);
        return 0;
    }
    return global_batch / (size_t)ctx->num_replicas_in_sync;
}

tpu_status tpu_strategy_distribute_datasets_from_function(tpu_strategy *s, tpu_dataset_fn fn, void *user,
                                                          tpu_dist_dataset **out)
{
    tpu_dataset *ds = NULL;
    tpu_status st;
    CHECK_HANDLE(s, MAGIC_STRATEGY, "tpu_strategy");
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "distribute_datasets_from_function: out is NULL");
    *out = NULL;
    if (!fn)
        return cli_failf(TPU_INVALID_ARGUMENT, "distribute_datasets_from_function: no dataset function");
    if (!s->c->coll || !s->c->coll->n)
        return cli_failf(TPU_FAILED_PRECONDITION,
                         "distribute_datasets_from_function: no TPU system; initialize it first");
    tpu_input_context ctx = {
        .num_input_pipelines = 1, .input_pipeline_id = 0, .num_replicas_in_sync = (int)s->c->coll->n};
    if ((st = fn(&ctx, user, &ds)) != TPU_OK) {
        char why[ERR_MSG_MAX];
        snprintf(why, sizeof why, "%s", tpu_last_error()); /* the message is formatted into the same buffer */
        tpu_dataset_free(ds);
        return cli_failf((int)st, "distribute_datasets_from_function: the dataset function failed (%s): %s",
                         tpu_status_name(st), why);
    }
    if (!ds)
        return cli_failf(TPU_INVALID_ARGUMENT, "distribute_datasets_from_function: the dataset function returned "
                         "TPU_OK and no dataset");
    if (!tpu_dataset_batch_size(ds)) {
        tpu_dataset_free(ds);
        return cli_failf(TPU_INVALID_ARGUMENT,
                         "distribute_datasets_from_function: the function's dataset is not batched; batch it by the "
                         "per-replica batch (tpu_input_context_per_replica_batch_size)");
    }
    if ((st = dist_new(s, ds, 1, out)) != TPU_OK)
        tpu_dataset_free(ds);
    return st;
}

const struct hin_spec *file_dataset_spec(const tpu_file_dataset *fd); /* data/files.c */

tpu_status tpu_strategy_distribute_datasets_from_files(tpu_strategy *s, const tpu_file_dataset *fd,
                                                       tpu_input_placement where, tpu_dataset **out)
{
    static const char *const fn = "distribute_datasets_from_files";
    const struct hin_spec *spec;
    uint32_t n;
    err e;
    CHECK_HANDLE(s, MAGIC_STRATEGY, "tpu_strategy");
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: out is NULL", fn);
    *out = NULL;
    if (!fd)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: no file dataset", fn);
    spec = file_dataset_spec(fd);
    if (where != TPU_INPUT_ON_HOSTS && where != TPU_INPUT_ON_CLIENT)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: unknown placement %d (TPU_INPUT_ON_HOSTS or TPU_INPUT_ON_CLIENT)",
                         fn, (int)where);
    if (!s->c->coll || !s->c->coll->n)
        return cli_failf(TPU_FAILED_PRECONDITION, "%s: no TPU system; initialize it first", fn);
    n = (uint32_t)s->c->coll->n;
    err_clear(&e);
    if (hin_spec_check(spec, &e) != CODE_OK) {
        err_prefix(&e, "%s", fn);
        return cli_fail(&e);
    }
    if (hin_epoch_steps(spec, n) == 0)
        return cli_failf(TPU_INVALID_ARGUMENT,
                         "%s: %llu rows over %u input pipelines give a pipeline less than one "
                         "batch of %u rows",
                         fn, (unsigned long long)spec->rows, (unsigned)n, (unsigned)hin_batch_size(spec));
    if (dataset_from_files(spec, n, where == TPU_INPUT_ON_HOSTS, out, &e) != CODE_OK)
        return cli_fail(&e);
    return TPU_OK;
}

void tpu_dist_dataset_free(tpu_dist_dataset *dd)
{
    if (!dd)
        return;
    CHECK_HANDLE(dd, MAGIC_DIST, "tpu_dist_dataset");
    if (dd->it)
        tpu_dist_iter_free(dd->it);
    if (dd->from_fn)
        tpu_dataset_free(dd->ds);
    dd->magic = MAGIC_DEAD;
    free(dd);
}

tpu_status tpu_dist_dataset_iter(tpu_dist_dataset *dd, tpu_dist_iter **out)
{
    tpu_dist_iter *it;
    CHECK_HANDLE(dd, MAGIC_DIST, "tpu_dist_dataset");
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "iter(dist_dataset): out is NULL");
    *out = NULL;
    if (dd->it)
        return cli_failf(TPU_FAILED_PRECONDITION, "iter(dist_dataset): the distributed dataset has an iterator "
                         "already (free it first)");
    if (!(it = calloc(1, sizeof *it)))
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    it->magic = MAGIC_DIST_IT;
    it->dd = dd;
    if (tpu_dataset_iter_new(dd->ds, dd->passes, 0, &it->it) != TPU_OK) {
        free(it);
        return tpu_last_status();
    }
    dd->passes++;
    dd->it = it;
    *out = it;
    return TPU_OK;
}

void tpu_dist_iter_free(tpu_dist_iter *it)
{
    if (!it)
        return;
    CHECK_HANDLE(it, MAGIC_DIST_IT, "tpu_dist_iter");
    tpu_dataset_iter_free(it->it);
    it->dd->it = NULL;
    it->magic = MAGIC_DEAD;
    free(it);
}

/* The shard sizes of a full global batch of g rows on n replicas, as
 * tf.data's batch_sizes_for_worker(g, 1, n, 0): the first g mod n get one
 * more. A batch of k <= g rows fills them in order (rebatch). */
static void tf_shards(size_t g, size_t k, size_t n, size_t *rows)
{
    size_t floor = g / n, nceil = g % n, left = k;
    for (size_t r = 0; r < n; r++) {
        size_t want = floor + (r < nceil ? 1 : 0);
        rows[r] = left < want ? left : want;
        left -= rows[r];
    }
}

/* An input value for n replicas of rows[r] rows each (x and y left to fill). */
static tpu_per_replica *pr_input(const tpu_dataset *ds, size_t n, const size_t *rows)
{
    tpu_per_replica *p = pr_alloc(n);
    if (!p)
        return NULL;
    p->input = 1;
    p->rank = 2;
    p->x_dim = tpu_dataset_x_dim(ds);
    p->cols = p->x_dim;
    p->lk = tpu_dataset_label_kind(ds);
    p->y_dim = tpu_dataset_y_dim(ds);
    p->ybytes = label_bytes(ds);
    for (size_t r = 0; r < n; r++) {
        p->rows[r] = rows[r];
        p->off[r] = p->total;
        p->total += rows[r];
    }
    p->x = malloc(p->total * p->x_dim * sizeof(float) + 1);
    p->y = malloc(p->total * p->ybytes + 1);
    if (!p->x || !p->y) {
        tpu_per_replica_free(p);
        return NULL;
    }
    return p;
}

/* rows of b from row first on, into p's rows from row `at` on */
static void pr_put(tpu_per_replica *p, size_t at, const tpu_batch *b, size_t first, size_t rows)
{
    memcpy(p->x + at * p->x_dim, b->x + first * p->x_dim, rows * p->x_dim * sizeof(float));
    if (p->ybytes && b->y)
        memcpy(p->y + at * p->ybytes, (const uint8_t *)b->y + first * p->ybytes, rows * p->ybytes);
}

/* experimental_distribute_dataset: one global batch split as tf.data's rebatch splits it */
static tpu_status next_split(tpu_dist_iter *it, tpu_per_replica **out)
{
    tpu_dist_dataset *dd = it->dd;
    size_t n = dd->n, *rows = calloc(n, sizeof *rows);
    tpu_batch b;
    tpu_status st;

    if (!rows)
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    if ((st = tpu_dataset_iter_next(it->it, &b)) != TPU_OK) {
        free(rows);
        return st;
    }
    if (b.rows == 0) {
        it->done = 1;
    } else {
        tpu_per_replica *p;
        tf_shards(tpu_dataset_batch_size(dd->ds), b.rows, n, rows);
        if (!(p = pr_input(dd->ds, n, rows)))
            st = cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
        else
            pr_put(p, 0, &b, 0, b.rows); /* the shards are consecutive row ranges, in replica order */
        *out = p;
    }
    tpu_dataset_iter_release(it->it, &b);
    free(rows);
    return st;
}

/* distribute_datasets_from_function: the next batch to each replica in turn,
 * each copied as it comes (so any number of replicas), then packed */
static tpu_status next_dealt(tpu_dist_iter *it, tpu_per_replica **out)
{
    tpu_dist_dataset *dd = it->dd;
    size_t n = dd->n, per = tpu_dataset_batch_size(dd->ds), got = 0;
    size_t *rows = calloc(n, sizeof *rows), *have = calloc(n, sizeof *have);
    tpu_per_replica *p = NULL;
    tpu_status st = TPU_OK;

    if (!rows || !have) {
        free(rows);
        free(have);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t r = 0; r < n; r++)
        rows[r] = per;
    if (!(p = pr_input(dd->ds, n, rows)))
        st = cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    while (st == TPU_OK && !it->done && got < n) {
        tpu_batch b;
        if ((st = tpu_dataset_iter_next(it->it, &b)) != TPU_OK)
            break;
        if (b.rows == 0) {
            it->done = 1;
        } else {
            have[got] = b.rows < per ? b.rows : per;
            pr_put(p, p->off[got], &b, 0, have[got]);
            got++;
        }
        tpu_dataset_iter_release(it->it, &b);
    }
    if (st == TPU_OK && got) { /* pack: replica r's rows right after replica r-1's */
        size_t at = 0;
        for (size_t r = 0; r < n; r++) {
            if (at != p->off[r]) {
                memmove(p->x + at * p->x_dim, p->x + p->off[r] * p->x_dim, have[r] * p->x_dim * sizeof(float));
                memmove(p->y + at * p->ybytes, p->y + p->off[r] * p->ybytes, have[r] * p->ybytes);
            }
            p->rows[r] = have[r];
            p->off[r] = at;
            at += have[r];
        }
        p->total = at;
        *out = p;
        p = NULL;
    }
    tpu_per_replica_free(p);
    free(rows);
    free(have);
    return st;
}

tpu_status tpu_dist_iter_next(tpu_dist_iter *it, tpu_per_replica **out)
{
    CHECK_HANDLE(it, MAGIC_DIST_IT, "tpu_dist_iter");
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "next(iterator): out is NULL");
    *out = NULL;
    if (it->done)
        return TPU_OK;
    tpu_status st = it->dd->from_fn ? next_dealt(it, out) : next_split(it, out);
    if (st != TPU_OK && *out) {
        tpu_per_replica_free(*out);
        *out = NULL;
    }
    return st;
}

/* ---- strategy.run ---- */

static int check_input(const tpu_model *m, tpu_step_fn fn, const tpu_per_replica *x, err *e)
{
    size_t units = m->units[m->nlayers - 1];
    if (x->x_dim != m->in_dim)
        return err_set(e, CODE_INVALID_ARGUMENT, "strategy.run: the input's rows have %zu features; the model takes %zu",
                       x->x_dim, m->in_dim);
    if (x->total == 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "strategy.run: the input has no rows on any replica");
    if (fn == TPU_STEP_PREDICT)
        return CODE_OK;
    if (m->co.loss == TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY) {
        if (x->lk != TPU_LABELS_SPARSE)
            return err_set(e, CODE_INVALID_ARGUMENT, "strategy.run: sparse categorical cross-entropy needs int32 class "
                           "ids (TPU_LABELS_SPARSE); the input has %s", x->lk == TPU_LABELS_NONE ? "no labels"
                                                                                                 : "dense labels");
        const int32_t *y = (const int32_t *)(const void *)x->y;
        for (size_t i = 0; i < x->total; i++)
            if (y[i] < 0 || (size_t)y[i] >= units) {
                size_t r = 0;
                while (r + 1 < x->n && i >= x->off[r + 1])
                    r++;
                return err_set(e, CODE_INVALID_ARGUMENT, "strategy.run: label %d in row %zu of replica %zu's shard is "
                               "outside 0..%zu (the last layer has %zu units)", (int)y[i], i - x->off[r], r, units - 1,
                               units);
            }
    } else if (x->lk != TPU_LABELS_DENSE || x->y_dim != units) {
        return err_set(e, CODE_INVALID_ARGUMENT, "strategy.run: this loss needs labels of %zu floats per row "
                       "(TPU_LABELS_DENSE)", units);
    }
    return CODE_OK;
}

static void outputs_clear(tpu_step_outputs *o)
{
    tpu_per_replica_free(o->loss);
    tpu_per_replica_free(o->loss_sum);
    tpu_per_replica_free(o->correct);
    tpu_per_replica_free(o->examples);
    tpu_per_replica_free(o->predictions);
    memset(o, 0, sizeof *o);
}

void tpu_step_outputs_free(tpu_step_outputs *o)
{
    tpu_step_outputs_clear(o);
}

void tpu_step_outputs_clear(tpu_step_outputs *o)
{
    if (o)
        outputs_clear(o);
}

/* One step of mode on every replica with x's shards; answers into ans[n]. */
static int run_step(tpu_model *m, int mode, const tpu_per_replica *x, struct tio_ans *ans, float *pred, err *e)
{
    tpu_cluster *c = m->s->c;
    size_t n = x->n, units = m->units[m->nlayers - 1];
    struct tio_ans **pa = calloc(n, sizeof *pa);
    struct dpio_seg *segs = calloc(2 * n, sizeof *segs);
    int rc = CODE_OK;

    if (!pa || !segs) {
        free(pa);
        free(segs);
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    }
    struct tio_steps ss;
    uint32_t rows[1], grows[1] = {(uint32_t)x->total};
    int has_labels = mode != TPU_STEP_PREDICT;
    memset(&ss, 0, sizeof ss);
    ss.model_id = m->id;
    ss.mode = (tpu_step_fn)mode;
    ss.steps = 1;
    ss.rows = rows;
    ss.global_rows = grows;
    ss.first_step = m->step + 1;
    ss.colls_per_step = model_sync_calls_per_step(m);
    tio_steps_begin(c, &ss);
    uint64_t t0 = now_ns();
    for (size_t r = 0; r < n && rc == CODE_OK; r++) {
        size_t ns = 0;
        pa[r] = &ans[r];
        rows[0] = (uint32_t)x->rows[r];
        segs[2 * r].p = x->x + x->off[r] * x->x_dim;
        segs[2 * r].n = x->rows[r] * x->x_dim * sizeof(float);
        ns = 1;
        if (has_labels) {
            segs[2 * r + 1].p = x->y + x->off[r] * x->ybytes;
            segs[2 * r + 1].n = x->rows[r] * x->ybytes;
            ns = 2;
        }
        ans[r].dst = pred ? pred + x->off[r] * units : NULL;
        ans[r].dst_cap = pred ? x->rows[r] * units * sizeof(float) : 0;
        ss.client_input_start_ns = r == 0 ? t0 : 0;
        ss.client_post_ns = r == 0 ? now_ns() : 0;
        ss.client_pid = r == 0 ? (uint32_t)getpid() : 0;
        if ((rc = tio_post_steps(c, r, &ss, &segs[2 * r], ns, &ans[r], e)) != CODE_OK)
            tio_abort(c);
    }
    if (rc == CODE_OK) {
        size_t bytes = x->total * (x->x_dim * sizeof(float) + x->ybytes) / n;
        size_t failed = tio_wait(c, pa, model_deadline(c, bytes), cli_coll_grace_ms(c));
        if (failed) {
            const struct tio_ans *w = tio_worst(pa, n);
            int lost = 0;
            for (size_t r = 0; r < n; r++)
                lost |= ans[r].code == CODE_UNAVAILABLE || ans[r].code == CODE_DEADLINE_EXCEEDED ||
                        ans[r].code == CODE_CANCELLED;
            rc = err_set(e, w ? w->code : CODE_UNKNOWN, "strategy.run: %s", w ? w->msg : "the step failed");
            if (lost)
                tio_abort(c);
        }
    }
    if (rc == CODE_OK) {
        tpu_step_stats s;
        memset(&s, 0, sizeof s);
        m->notice.kind = TPU_NOTICE_NONE;
        m->notice_replica = -1;
        for (size_t r = 0; r < n; r++) {
            const struct tio_stat *a = ans[r].nstats ? &ans[r].stats[0] : NULL;
            model_stats_max(&s, a);
            if (ans[r].hbm_used > m->hbm_used)
                m->hbm_used = ans[r].hbm_used;
            if (ans[r].notice.kind != TPU_NOTICE_NONE &&
                (m->notice.kind == TPU_NOTICE_NONE || ans[r].notice.event_in_ms < m->notice.event_in_ms)) {
                m->notice = ans[r].notice;
                m->notice_replica = (int)r;
            }
        }
        if (mode == TPU_STEP_TRAIN) {
            m->step++;
            m->iterations++;
        }
        s.step = m->step;
        s.rows = x->total;
        s.wall_ns = now_ns() - t0;
        m->last = s;
    }
    free(pa);
    free(segs);
    return rc;
}

tpu_status tpu_strategy_run(tpu_strategy *s, tpu_step_fn fn, tpu_model *m, const tpu_per_replica *x,
                            tpu_step_outputs *out)
{
    err e;
    int mode, rc;
    CHECK_HANDLE(s, MAGIC_STRATEGY, "tpu_strategy");
    CHECK_HANDLE(m, MAGIC_MODEL, "tpu_model");
    CLI_CALL(s->c);
    CHECK_HANDLE(x, MAGIC_PR, "tpu_per_replica");
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "strategy.run: out is NULL");
    memset(out, 0, sizeof *out);
    switch (fn) {
    case TPU_STEP_TRAIN:
    case TPU_STEP_EVALUATE:
    case TPU_STEP_PREDICT:
        mode = (int)fn;
        break;
    default:
        return cli_failf(TPU_INVALID_ARGUMENT, "strategy.run: step function %d is not a tpu_step_fn "
                         "(TPU_STEP_TRAIN, TPU_STEP_EVALUATE, TPU_STEP_PREDICT)", (int)fn);
    }
    if (m->s != s)
        return cli_failf(TPU_INVALID_ARGUMENT, "strategy.run: the model was built in another strategy");
    if (!x->input)
        return cli_failf(TPU_INVALID_ARGUMENT, "strategy.run: the argument is a step's output, not an input "
                         "(a value of tpu_dist_iter_next)");
    if (!m->configured)
        return cli_failf(TPU_FAILED_PRECONDITION, "strategy.run: compile the model first (tpu_model_compile)");
    if (!s->c->coll || !s->c->coll->n)
        return cli_failf(TPU_FAILED_PRECONDITION, "strategy.run: no TPU system; initialize it first");
    size_t n = s->c->coll->n;
    if (x->n != n)
        return cli_failf(TPU_INVALID_ARGUMENT, "strategy.run: the input is split for %zu replicas; the strategy has "
                         "%zu now (distribute the dataset again)", x->n, n);
    if (check_input(m, fn, x, &e) != CODE_OK)
        return cli_fail(&e);
    size_t most = 0;
    for (size_t r = 0; r < n; r++)
        if (x->rows[r] > most)
            most = x->rows[r];
    if (model_ensure_compiled(m, most * n, &e) != CODE_OK)
        return cli_fail(&e);

    size_t units = m->units[m->nlayers - 1];
    struct tio_ans *ans = calloc(n, sizeof *ans);
    float *pred = NULL;
    if (!ans || (fn == TPU_STEP_PREDICT && !(pred = malloc(x->total * units * sizeof(float) + 1)))) {
        free(ans);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "out of memory");
    }
    rc = run_step(m, mode, x, ans, pred, &e);
    if (rc == CODE_OK) {
        size_t *ones = x->rows; /* unused for scalars */
        out->examples = pr_tensor(n, 0, ones, 1);
        if (fn != TPU_STEP_PREDICT) {
            out->loss = pr_tensor(n, 0, ones, 1);
            out->loss_sum = pr_tensor(n, 0, ones, 1);
            if (m->co.loss != TPU_LOSS_MEAN_SQUARED_ERROR)
                out->correct = pr_tensor(n, 0, ones, 1);
        } else {
            out->predictions = pr_tensor(n, 2, x->rows, units);
        }
        if (!out->examples || (fn != TPU_STEP_PREDICT && (!out->loss || !out->loss_sum ||
                                                          (m->co.loss != TPU_LOSS_MEAN_SQUARED_ERROR && !out->correct))) ||
            (fn == TPU_STEP_PREDICT && !out->predictions)) {
            outputs_clear(out);
            rc = err_set(&e, CODE_RESOURCE_EXHAUSTED, "out of memory");
        }
    }
    if (rc == CODE_OK) {
        for (size_t r = 0; r < n; r++) {
            const struct tio_stat *a = ans[r].nstats ? &ans[r].stats[0] : NULL;
            out->examples->v[r] = (double)x->rows[r];
            if (fn != TPU_STEP_PREDICT) {
                double ls = a ? a->loss_sum : 0;
                out->loss_sum->v[r] = ls;
                out->loss->v[r] = ls / (double)x->total;
                if (out->correct)
                    out->correct->v[r] = a ? (double)a->correct : 0;
            }
        }
        if (pred) {
            size_t want = 0;
            for (size_t r = 0; r < n && rc == CODE_OK; r++)
                if (ans[r].got != (want = x->rows[r] * units * sizeof(float)))
                    rc = err_set(&e, CODE_INTERNAL, "strategy.run: replica %zu sent %zu bytes of predictions, not %zu",
                                 r, ans[r].got, want);
            for (size_t i = 0; rc == CODE_OK && i < x->total * units; i++)
                out->predictions->v[i] = (double)pred[i];
            if (rc != CODE_OK)
                outputs_clear(out);
        }
    }
    free(ans);
    free(pred);
    return rc == CODE_OK ? TPU_OK : cli_fail(&e);
}

/* ---- reduce, local results ---- */

static double pr_at(const tpu_per_replica *p, size_t row, size_t col)
{
    if (p->input)
        return (double)p->x[row * p->x_dim + col];
    return p->v[row * p->cols + col];
}

tpu_status tpu_strategy_reduce(const tpu_strategy *s, tpu_reduce_op op, const tpu_per_replica *value, int axis,
                               double *out, size_t n, size_t *got)
{
    CHECK_HANDLE(s, MAGIC_STRATEGY, "tpu_strategy");
    CHECK_HANDLE(value, MAGIC_PR, "tpu_per_replica");
    const tpu_per_replica *p = value;
    size_t need;
    if (got)
        *got = 0;
    if (op != TPU_SUM && op != TPU_MEAN)
        return cli_failf(TPU_INVALID_ARGUMENT, "strategy.reduce: op %d: tf.distribute.ReduceOp has SUM "
                         "and MEAN only (TPU_SUM, TPU_MEAN)", (int)op);
    if (axis != TPU_AXIS_NONE && axis != 0)
        return cli_failf(TPU_INVALID_ARGUMENT, "strategy.reduce: axis %d: only TPU_AXIS_NONE (across replicas) and 0 "
                         "(the batch) are supported", axis);
    if (axis == 0 && p->rank == 0)
        return cli_failf(TPU_INVALID_ARGUMENT, "strategy.reduce: axis 0 of a scalar per replica (it has no batch "
                         "dimension; use TPU_AXIS_NONE)");
    if (axis == TPU_AXIS_NONE) {
        for (size_t r = 1; r < p->n; r++)
            if (p->rows[r] != p->rows[0])
                return cli_failf(TPU_INVALID_ARGUMENT, "strategy.reduce: across replicas the values must have the same "
                                 "shape, and replica 0 has %zu rows, replica %zu %zu (a partial batch: reduce along "
                                 "axis 0)", p->rows[0], r, p->rows[r]);
        need = p->rank == 0 ? 1 : p->rows[0] * p->cols;
    } else {
        need = p->rank == 2 ? p->cols : 1;
    }
    if (got)
        *got = need;
    if (!out || n < need)
        return cli_failf(TPU_INVALID_ARGUMENT, "strategy.reduce: the result has %zu values; out has room for %zu", need,
                         out ? n : 0);
    if (axis == TPU_AXIS_NONE) {
        for (size_t j = 0; j < need; j++) {
            double sum = 0;
            for (size_t r = 0; r < p->n; r++)
                sum += pr_at(p, p->off[r] + j / p->cols, j % p->cols);
            out[j] = op == TPU_MEAN ? sum / (double)p->n : sum;
        }
    } else {
        for (size_t j = 0; j < need; j++) {
            double sum = 0;
            for (size_t r = 0; r < p->n; r++)
                for (size_t i = 0; i < p->rows[r]; i++)
                    sum += pr_at(p, p->off[r] + i, j);
            out[j] = op == TPU_MEAN ? sum / (double)p->total : sum;
        }
    }
    return TPU_OK;
}

tpu_status tpu_strategy_experimental_local_results(const tpu_strategy *s, const tpu_per_replica *value,
                                                   tpu_local_value *out, size_t n, size_t *got)
{
    CHECK_HANDLE(s, MAGIC_STRATEGY, "tpu_strategy");
    CHECK_HANDLE(value, MAGIC_PR, "tpu_per_replica");
    const tpu_per_replica *p = value;
    if (got)
        *got = p->n;
    if (!out || n < p->n)
        return cli_failf(TPU_INVALID_ARGUMENT, "experimental_local_results: the value has %zu replicas; out has room "
                         "for %zu", p->n, out ? n : 0);
    for (size_t r = 0; r < p->n; r++) {
        tpu_local_value *l = &out[r];
        memset(l, 0, sizeof *l);
        l->rank = p->rank;
        if (p->rank >= 1)
            l->dims[0] = p->rows[r];
        if (p->rank == 2)
            l->dims[1] = p->cols;
        if (p->input) {
            l->x = p->x + p->off[r] * p->x_dim;
            l->y = p->ybytes ? (const void *)(p->y + p->off[r] * p->ybytes) : NULL;
        } else {
            l->v = p->v + p->off[r] * p->cols;
        }
    }
    return TPU_OK;
}
