/* Input pipelines (tpuemu/data.h). A dataset is the source arrays and a list
 * of ops; an iterator turns the ops into a chain of stages and pulls one
 * epoch through them, on the caller's thread or on its prefetch thread.
 *
 * Rows travel as indices into the source arrays until something has to see
 * or change their values: batch() gathers them (one memcpy per row), a row
 * map copies its row into a scratch first. Batches are buffers from the
 * iterator's pool, handed down the chain with their ownership until the
 * consumer gives them back; in steady state nothing here allocates. This file
 * must not touch the cluster: it is plain host-side data. */
#include "dataset_int.h"

#include "hostin.h"
#include "rng.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAGIC_DATASET 0x74707064u /* "tpud" */
#define MAGIC_ITER 0x74707069u    /* "tpui" */
#define MAX_OPS 256
#define PREFETCH_MAX 1024
#define AUTOTUNE_START 2
#define AUTOTUNE_MAX 16

/* what pulling from a stage gives */
#define PULL_ELEM 1
#define PULL_END 0
#define PULL_ERR (-1)

enum op_kind { OP_SHUFFLE, OP_MAP, OP_CACHE, OP_BATCH };
static const char *const op_names[] = {"shuffle", "map", "cache", "batch"};

/* What a cache() keeps across iterators. Rows no map changed are kept as
 * source indices (idx); other rows and batches as values (x, y). */
struct cache_store {
    int complete;
    size_t count;          /* elements recorded */
    size_t nrows;          /* rows recorded */
    size_t *idx;           /* rows without values: source row of each element */
    float *x;              /* rows × x_dim */
    unsigned char *y;      /* rows × label size */
    size_t *off, *rows;    /* batches: first row and rows of each element */
};

struct op {
    enum op_kind kind;
    int batched; /* added after batch(): works on batches */
    size_t buffer;
    uint64_t seed;
    tpu_map_fn fn;
    void *user;
    size_t batch_size;
    int drop;
    struct cache_store cache;
};

struct tpu_dataset {
    uint32_t magic;
    const float *x;
    const unsigned char *y;
    void *own_x, *own_y;
    size_t n, xd, yd, ysz; /* ysz: bytes of one row's label */
    tpu_label_kind kind;
    struct op *ops;
    size_t nops;
    size_t batch_size;
    int drop;
    int prefetch; /* 0: none; TPU_AUTOTUNE or the depth */
    atomic_int iters;
    /* distributed from files (dataset_from_files): the spec, the pipelines,
     * where they run, and the client's own pipelines (opened at its first
     * iterator when they run here) */
    struct hin_spec *files;
    uint32_t fnum;
    int on_hosts;
    struct hin_pipe **pipes;
};

/* A row between stages: valid until the next pull from the stage that gave
 * it. mut: its storage is that stage's scratch, so a map may change it. */
typedef struct relem {
    size_t idx; /* source row */
    const float *x;
    const unsigned char *y;
    int mut;
} relem;

/* A batch buffer. x/y show either its own storage or a cache's. */
typedef struct bbuf {
    float *x;
    unsigned char *y;
    float *sx;
    unsigned char *sy;
    size_t rows, index;
    int held;
    struct tpu_dataset_iter *owner;
    struct bbuf *next; /* pool free list */
    struct bbuf *all;  /* every buffer of the iterator */
} bbuf;

struct stage {
    struct op *op; /* NULL: the implicit batch(1) of an unbatched dataset */
    enum op_kind kind;
    int batched;
    int data;     /* rows reaching it carry values (a row map came before) */
    size_t card;  /* elements its input yields per epoch */
    size_t pos;   /* elements it gave (or skipped) this epoch; cache: replay position */
    /* shuffle */
    uint64_t rng[4];
    size_t cap, count, hole;
    int filled, hole_pending, end;
    size_t *sidx;  /* rows: source row of each slot */
    size_t *sslot; /* rows with values: storage row of each slot */
    float *sx;
    unsigned char *sy;
    bbuf **sb; /* batches */
    /* row map scratch */
    float *mx;
    unsigned char *my;
    /* cache */
    int replay;
    /* batch */
    size_t bs;
    int drop;
};

struct tpu_dataset_iter {
    uint32_t magic;
    tpu_dataset *ds;
    uint64_t epoch;
    size_t skip;
    int started;
    struct stage *st;
    int nst;
    size_t src_pos;
    size_t bcap; /* rows per batch buffer */
    size_t next_index;
    pthread_mutex_t mu; /* pool; with prefetch also the queue and the flags below */
    bbuf *pool, *all;
    /* consumer side */
    size_t held;
    int failed;
    err ferr;
    /* prefetch */
    int threaded, autotune;
    pthread_t th;
    pthread_cond_t cv_cons, cv_prod;
    bbuf **q;
    size_t qcap, qhead, qlen, taken;
    atomic_int depth;
    atomic_int stop;
    int prod_done, prod_failed;
    err perr;
};

/* ---- small helpers ---- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int mul_overflows(size_t a, size_t b, size_t *out)
{
    if (a && b > SIZE_MAX / a)
        return 1;
    *out = a * b;
    return 0;
}

static size_t min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* ---- dataset ---- */

static tpu_dataset *dataset_of(const tpu_dataset *ds)
{
    CHECK_HANDLE(ds, MAGIC_DATASET, "tpu_dataset");
    return (tpu_dataset *)ds;
}

tpu_status tpu_dataset_from_tensor_slices(const float *x, size_t n, size_t x_dim, const void *y,
                                          tpu_label_kind kind, size_t y_dim, unsigned flags,
                                          tpu_dataset **out)
{
    static const char *const fn = "tpu_dataset_from_tensor_slices";
    size_t xbytes, ybytes = 0, ysz = 0;
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: out is NULL", fn);
    *out = NULL;
    if (!x)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: x is NULL", fn);
    if (n == 0 || x_dim == 0)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: %s is 0; a dataset needs at least one row of one value",
                         fn, n == 0 ? "n (rows)" : "x_dim");
    if (flags & ~TPU_BORROW)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: unknown flags 0x%x (only TPU_BORROW)", fn, flags);
    if (mul_overflows(n, x_dim, &xbytes) || mul_overflows(xbytes, sizeof(float), &xbytes))
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: %zu rows of %zu floats overflow the address space", fn, n,
                         x_dim);
    switch (kind) {
    case TPU_LABELS_NONE:
        if (y)
            return cli_failf(TPU_INVALID_ARGUMENT, "%s: labels given with TPU_LABELS_NONE (pass y = NULL)", fn);
        y_dim = 0;
        break;
    case TPU_LABELS_SPARSE:
        if (y_dim != 1)
            return cli_failf(TPU_INVALID_ARGUMENT,
                             "%s: sparse labels are one int32 class id per row, y_dim must be 1 (not %zu); "
                             "use TPU_LABELS_DENSE for vectors",
                             fn, y_dim);
        ysz = sizeof(int32_t);
        break;
    case TPU_LABELS_DENSE:
        if (y_dim == 0)
            return cli_failf(TPU_INVALID_ARGUMENT, "%s: dense labels with y_dim 0 (use TPU_LABELS_NONE)", fn);
        if (mul_overflows(y_dim, sizeof(float), &ysz))
            return cli_failf(TPU_INVALID_ARGUMENT, "%s: y_dim %zu overflows", fn, y_dim);
        break;
    default:
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: unknown label kind %d", fn, (int)kind);
    }
    if (kind != TPU_LABELS_NONE) {
        if (!y)
            return cli_failf(TPU_INVALID_ARGUMENT, "%s: y is NULL with %s labels", fn,
                             kind == TPU_LABELS_SPARSE ? "sparse" : "dense");
        if (mul_overflows(n, ysz, &ybytes))
            return cli_failf(TPU_INVALID_ARGUMENT, "%s: %zu labels of %zu bytes overflow the address space", fn,
                             n, ysz);
    }
    if (kind == TPU_LABELS_SPARSE) {
        const int32_t *ids = y;
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0)
                return cli_failf(TPU_INVALID_ARGUMENT, "%s: row %zu has class id %d; sparse labels must be >= 0",
                                 fn, i, (int)ids[i]);
    }

    tpu_dataset *ds = calloc(1, sizeof *ds);
    if (!ds)
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
    if (flags & TPU_BORROW) {
        ds->x = x;
        ds->y = y;
    } else {
        ds->own_x = malloc(xbytes);
        ds->own_y = ybytes ? malloc(ybytes) : NULL;
        if (!ds->own_x || (ybytes && !ds->own_y)) {
            free(ds->own_x);
            free(ds->own_y);
            free(ds);
            return cli_failf(TPU_RESOURCE_EXHAUSTED, "%s: out of memory copying %zu + %zu bytes (TPU_BORROW "
                             "avoids the copy)", fn, xbytes, ybytes);
        }
        memcpy(ds->own_x, x, xbytes);
        if (ybytes)
            memcpy(ds->own_y, y, ybytes);
        ds->x = ds->own_x;
        ds->y = ds->own_y;
    }
    ds->magic = MAGIC_DATASET;
    ds->n = n;
    ds->xd = x_dim;
    ds->yd = y_dim;
    ds->ysz = ysz;
    ds->kind = kind;
    atomic_init(&ds->iters, 0);
    *out = ds;
    return TPU_OK;
}

static void cache_release(struct cache_store *c)
{
    free(c->idx);
    free(c->x);
    free(c->y);
    free(c->off);
    free(c->rows);
    memset(c, 0, sizeof *c);
}

void tpu_dataset_free(tpu_dataset *ds)
{
    if (!ds)
        return;
    CHECK_HANDLE(ds, MAGIC_DATASET, "tpu_dataset");
    if (atomic_load(&ds->iters)) {
        fprintf(stderr, "libtpuclient: fatal: tpu_dataset_free(%p) while an iterator of it lives "
                        "(free the iterator first)\n", (void *)ds);
        abort();
    }
    for (size_t i = 0; i < ds->nops; i++)
        cache_release(&ds->ops[i].cache);
    free(ds->ops);
    for (uint32_t r = 0; ds->pipes && r < ds->fnum; r++)
        hin_close(ds->pipes[r]);
    free(ds->pipes);
    free(ds->files);
    free(ds->own_x);
    free(ds->own_y);
    ds->magic = MAGIC_DEAD;
    free(ds);
}

/* Checks a transformation may be added now, then appends it. */
static tpu_status add_op(tpu_dataset *ds, const char *what, const struct op *o)
{
    if (ds->files)
        return cli_failf(TPU_INVALID_ARGUMENT,
                         "%s: this dataset was distributed from files; its transformations "
                         "are those of its tpu_file_dataset",
                         what);
    if (atomic_load(&ds->iters))
        return cli_failf(TPU_FAILED_PRECONDITION, "%s: the dataset has a live iterator; free it before "
                         "changing the pipeline", what);
    if (ds->prefetch)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s after prefetch(): prefetch must be the last transformation",
                         what);
    if (ds->nops >= MAX_OPS)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: a pipeline has at most %d transformations", what, MAX_OPS);
    struct op *ops = realloc(ds->ops, (ds->nops + 1) * sizeof *ops);
    if (!ops)
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "%s: out of memory", what);
    ds->ops = ops;
    ops[ds->nops] = *o;
    ops[ds->nops].batched = ds->batch_size != 0;
    ds->nops++;
    return TPU_OK;
}

tpu_status tpu_dataset_shuffle(tpu_dataset *ds, size_t buffer_size, uint64_t seed)
{
    dataset_of(ds);
    if (buffer_size == 0)
        return cli_failf(TPU_INVALID_ARGUMENT, "shuffle: buffer_size 0; it must be >= 1 (1 keeps the order, "
                         ">= the number of elements gives a full shuffle)");
    return add_op(ds, "shuffle", &(struct op){.kind = OP_SHUFFLE, .buffer = buffer_size, .seed = seed});
}

tpu_status tpu_dataset_batch(tpu_dataset *ds, size_t batch_size, int drop_remainder)
{
    size_t bytes;
    dataset_of(ds);
    if (batch_size == 0)
        return cli_failf(TPU_INVALID_ARGUMENT, "batch: batch_size 0; it must be >= 1");
    if (ds->batch_size && !ds->prefetch) /* after prefetch, add_op says so */
        return cli_failf(TPU_INVALID_ARGUMENT, "batch: the dataset is batched already (batch size %zu); a "
                         "pipeline has one batch()", ds->batch_size);
    if (mul_overflows(min_sz(batch_size, ds->n), ds->xd * sizeof(float), &bytes))
        return cli_failf(TPU_INVALID_ARGUMENT, "batch: %zu rows of %zu floats overflow", batch_size, ds->xd);
    tpu_status s = add_op(ds, "batch", &(struct op){.kind = OP_BATCH, .batch_size = batch_size,
                                                    .drop = drop_remainder != 0});
    if (s == TPU_OK) {
        ds->batch_size = batch_size;
        ds->drop = drop_remainder != 0;
    }
    return s;
}

/* Elastic fit's re-shard keeping the per-replica batch: the pipeline's one
 * batch() takes batch_size rows from now on (between iterators; rows are
 * drawn before they are batched, so an epoch's order does not change). A
 * cache() or map() after the batch holds or sees batches of the old size,
 * so such a pipeline is refused. */
int dataset_rebatch(tpu_dataset *ds, size_t batch_size, err *e)
{
    tpu_dataset *d = dataset_of(ds);
    struct op *b = NULL;
    if (d->files)
        return err_set(e, CODE_FAILED_PRECONDITION,
                       "the dataset was distributed from files over %u input "
                       "pipelines, one per replica: distribute it again for the new replicas",
                       (unsigned)d->fnum);
    if (atomic_load(&d->iters))
        return err_set(e, CODE_FAILED_PRECONDITION, "the dataset has a live iterator");
    for (size_t i = 0; i < d->nops; i++) {
        if (d->ops[i].kind == OP_BATCH)
            b = &d->ops[i];
        else if (d->ops[i].batched && d->ops[i].kind != OP_SHUFFLE)
            return err_set(e, CODE_FAILED_PRECONDITION, "the pipeline has a %s() after its batch(), which would see "
                           "batches of the old size; keep the global batch instead", op_names[d->ops[i].kind]);
    }
    if (!b || !batch_size)
        return err_set(e, CODE_FAILED_PRECONDITION, "the dataset is not batched");
    b->batch_size = batch_size;
    d->batch_size = batch_size;
    return CODE_OK;
}

tpu_status tpu_dataset_map(tpu_dataset *ds, tpu_map_fn fn, void *user)
{
    dataset_of(ds);
    if (!fn)
        return cli_failf(TPU_INVALID_ARGUMENT, "map: fn is NULL");
    return add_op(ds, "map", &(struct op){.kind = OP_MAP, .fn = fn, .user = user});
}

tpu_status tpu_dataset_cache(tpu_dataset *ds)
{
    dataset_of(ds);
    return add_op(ds, "cache", &(struct op){.kind = OP_CACHE});
}

tpu_status tpu_dataset_prefetch(tpu_dataset *ds, int n)
{
    dataset_of(ds);
    if (atomic_load(&ds->iters))
        return cli_failf(TPU_FAILED_PRECONDITION, "prefetch: the dataset has a live iterator; free it before "
                         "changing the pipeline");
    if (ds->prefetch)
        return cli_failf(TPU_INVALID_ARGUMENT, "prefetch after prefetch(): a pipeline has one prefetch, last");
    if (n != TPU_AUTOTUNE && (n < 1 || n > PREFETCH_MAX))
        return cli_failf(TPU_INVALID_ARGUMENT, "prefetch: depth %d outside 1..%d (or TPU_AUTOTUNE)", n,
                         PREFETCH_MAX);
    ds->prefetch = n;
    return TPU_OK;
}

size_t tpu_dataset_num_rows(const tpu_dataset *ds)
{
    return dataset_of(ds)->n;
}

size_t tpu_dataset_x_dim(const tpu_dataset *ds)
{
    return dataset_of(ds)->xd;
}

tpu_label_kind tpu_dataset_label_kind(const tpu_dataset *ds)
{
    return dataset_of(ds)->kind;
}

size_t tpu_dataset_y_dim(const tpu_dataset *ds)
{
    return dataset_of(ds)->yd;
}

size_t tpu_dataset_batch_size(const tpu_dataset *ds)
{
    return dataset_of(ds)->batch_size;
}

int tpu_dataset_drop_remainder(const tpu_dataset *ds)
{
    return dataset_of(ds)->drop;
}

size_t tpu_dataset_num_batches(const tpu_dataset *ds)
{
    const tpu_dataset *d = dataset_of(ds);
    if (d->files)
        return (size_t)hin_epoch_steps(d->files, d->fnum);
    if (!d->batch_size)
        return d->n;
    return d->n / d->batch_size + (!d->drop && d->n % d->batch_size != 0);
}

/* ---- the batch pool ---- */

static bbuf *pool_get(tpu_dataset_iter *it, err *e)
{
    pthread_mutex_lock(&it->mu);
    bbuf *b = it->pool;
    if (b)
        it->pool = b->next;
    pthread_mutex_unlock(&it->mu);
    if (!b) {
        const tpu_dataset *ds = it->ds;
        b = calloc(1, sizeof *b);
        if (b) {
            b->sx = malloc(it->bcap * ds->xd * sizeof(float));
            b->sy = ds->ysz ? malloc(it->bcap * ds->ysz) : NULL;
        }
        if (!b || !b->sx || (ds->ysz && !b->sy)) {
            if (b) {
                free(b->sx);
                free(b->sy);
            }
            free(b);
            err_set(e, CODE_RESOURCE_EXHAUSTED, "dataset iterator: out of memory for a batch of %zu rows",
                    it->bcap);
            return NULL;
        }
        b->owner = it;
        pthread_mutex_lock(&it->mu);
        b->all = it->all;
        it->all = b;
        pthread_mutex_unlock(&it->mu);
    }
    b->x = b->sx;
    b->y = b->sy;
    b->rows = 0;
    return b;
}

static void pool_put(tpu_dataset_iter *it, bbuf *b)
{
    pthread_mutex_lock(&it->mu);
    b->next = it->pool;
    it->pool = b;
    pthread_mutex_unlock(&it->mu);
}

/* ---- stages ---- */

static int row_next(tpu_dataset_iter *it, int i, relem *out, err *e);
static int batch_next(tpu_dataset_iter *it, int i, bbuf **out, err *e);

static int cancelled(tpu_dataset_iter *it, err *e)
{
    if (!atomic_load_explicit(&it->stop, memory_order_relaxed))
        return 0;
    err_set(e, CODE_CANCELLED, "dataset iterator: stopped");
    return 1;
}

static int map_failed(tpu_dataset_iter *it, int i, int rc, const char *what, size_t elem, size_t src, err *e)
{
    char where[64] = "";
    if (src != SIZE_MAX)
        snprintf(where, sizeof where, " (source row %zu)", src);
    err_set(e, CODE_ABORTED, "map callback of transformation %d returned %d on %s %zu%s of epoch %llu; the "
            "epoch is stopped", i, rc, what, elem, where, (unsigned long long)it->epoch);
    return PULL_ERR;
}

/* Shuffle, rows or batches: fill the buffer, then emit a uniformly chosen
 * slot and refill it from the input on the next pull (so the element stays
 * valid until then); once the input ends, the last slot fills the hole. */
static int shuf_pull(tpu_dataset_iter *it, int i, size_t slot, err *e)
{
    struct stage *s = &it->st[i];
    if (s->end)
        return PULL_END;
    int r;
    if (s->batched) {
        bbuf *b;
        r = batch_next(it, i - 1, &b, e);
        if (r == PULL_ELEM)
            s->sb[slot] = b;
    } else {
        relem el;
        r = row_next(it, i - 1, &el, e);
        if (r == PULL_ELEM) {
            const tpu_dataset *ds = it->ds;
            s->sidx[slot] = el.idx;
            if (s->data) {
                size_t k = s->sslot[slot];
                memcpy(s->sx + k * ds->xd, el.x, ds->xd * sizeof(float));
                if (ds->ysz)
                    memcpy(s->sy + k * ds->ysz, el.y, ds->ysz);
            }
        }
    }
    if (r == PULL_END)
        s->end = 1;
    return r;
}

static void shuf_remove(struct stage *s, size_t j)
{
    size_t last = --s->count, t;
    if (j == last)
        return;
    if (s->batched) {
        bbuf *b = s->sb[j];
        s->sb[j] = s->sb[last];
        s->sb[last] = b;
        return;
    }
    t = s->sidx[j], s->sidx[j] = s->sidx[last], s->sidx[last] = t;
    if (s->data)
        t = s->sslot[j], s->sslot[j] = s->sslot[last], s->sslot[last] = t;
}

static int shuf_next(tpu_dataset_iter *it, int i, size_t *slot, err *e)
{
    struct stage *s = &it->st[i];
    int r;
    if (!s->filled) {
        s->filled = 1;
        while (s->count < s->cap) {
            if (cancelled(it, e))
                return PULL_ERR;
            if ((r = shuf_pull(it, i, s->count, e)) < 0)
                return r;
            if (r == PULL_END)
                break;
            s->count++;
        }
    } else if (s->hole_pending) {
        s->hole_pending = 0;
        if ((r = shuf_pull(it, i, s->hole, e)) < 0)
            return r;
        if (r == PULL_END)
            shuf_remove(s, s->hole);
    }
    if (s->count == 0)
        return PULL_END;
    s->hole = (size_t)rng_below(s->rng, s->count);
    s->hole_pending = 1;
    s->pos++;
    *slot = s->hole;
    return PULL_ELEM;
}

static int row_next(tpu_dataset_iter *it, int i, relem *out, err *e)
{
    const tpu_dataset *ds = it->ds;
    if (i < 0) { /* the source */
        if (it->src_pos >= ds->n)
            return PULL_END;
        size_t k = it->src_pos++;
        *out = (relem){k, ds->x + k * ds->xd, ds->y ? ds->y + k * ds->ysz : NULL, 0};
        return PULL_ELEM;
    }
    struct stage *s = &it->st[i];
    struct cache_store *c;
    size_t slot;
    int r;
    switch (s->kind) {
    case OP_SHUFFLE:
        if ((r = shuf_next(it, i, &slot, e)) != PULL_ELEM)
            return r;
        out->idx = s->sidx[slot];
        if (s->data) {
            size_t k = s->sslot[slot];
            out->x = s->sx + k * ds->xd;
            out->y = ds->ysz ? s->sy + k * ds->ysz : NULL;
            out->mut = 1;
        } else {
            out->x = ds->x + out->idx * ds->xd;
            out->y = ds->y ? ds->y + out->idx * ds->ysz : NULL;
            out->mut = 0;
        }
        return PULL_ELEM;
    case OP_MAP:
        if ((r = row_next(it, i - 1, out, e)) != PULL_ELEM)
            return r;
        if (!out->mut) {
            memcpy(s->mx, out->x, ds->xd * sizeof(float));
            if (ds->ysz)
                memcpy(s->my, out->y, ds->ysz);
            out->x = s->mx;
            out->y = ds->ysz ? s->my : NULL;
            out->mut = 1;
        }
        if ((r = s->op->fn((float *)out->x, (void *)out->y, 1, ds->xd, s->op->user)) != 0)
            return map_failed(it, i, r, "row", s->pos, out->idx, e);
        s->pos++;
        return PULL_ELEM;
    case OP_CACHE:
        c = &s->op->cache;
        if (s->replay) {
            if (s->pos >= c->count)
                return PULL_END;
            size_t k = s->pos++;
            if (s->data) {
                out->idx = c->idx[k];
                out->x = c->x + k * ds->xd;
                out->y = ds->ysz ? c->y + k * ds->ysz : NULL;
            } else {
                out->idx = c->idx[k];
                out->x = ds->x + out->idx * ds->xd;
                out->y = ds->y ? ds->y + out->idx * ds->ysz : NULL;
            }
            out->mut = 0;
            return PULL_ELEM;
        }
        if ((r = row_next(it, i - 1, out, e)) != PULL_ELEM) {
            if (r == PULL_END && c->count == s->card)
                c->complete = 1;
            return r;
        }
        if (c->count < s->card) {
            size_t k = c->count++;
            c->idx[k] = out->idx;
            if (s->data) {
                memcpy(c->x + k * ds->xd, out->x, ds->xd * sizeof(float));
                if (ds->ysz)
                    memcpy(c->y + k * ds->ysz, out->y, ds->ysz);
            }
            if (c->count == s->card)
                c->complete = 1;
        }
        return PULL_ELEM;
    case OP_BATCH:
        break;
    }
    err_set(e, CODE_INTERNAL, "dataset: stage %d (%s) does not give rows", i, op_names[s->kind]);
    return PULL_ERR;
}

/* batch(): gathers rows into a pool buffer, one memcpy per row */
static int gather(tpu_dataset_iter *it, int i, bbuf **out, err *e)
{
    struct stage *s = &it->st[i];
    const tpu_dataset *ds = it->ds;
    bbuf *b = pool_get(it, e);
    if (!b)
        return PULL_ERR;
    size_t rows = 0;
    int r = PULL_END;
    while (rows < s->bs) {
        relem el;
        if (cancelled(it, e)) {
            r = PULL_ERR;
            break;
        }
        if ((r = row_next(it, i - 1, &el, e)) != PULL_ELEM)
            break;
        memcpy(b->sx + rows * ds->xd, el.x, ds->xd * sizeof(float));
        if (ds->ysz)
            memcpy(b->sy + rows * ds->ysz, el.y, ds->ysz);
        rows++;
    }
    if (r < 0 || rows == 0 || (s->drop && rows < s->bs)) {
        pool_put(it, b);
        return r < 0 ? r : PULL_END;
    }
    b->rows = rows;
    s->pos++;
    *out = b;
    return PULL_ELEM;
}

static int batch_next(tpu_dataset_iter *it, int i, bbuf **out, err *e)
{
    struct stage *s = &it->st[i];
    const tpu_dataset *ds = it->ds;
    struct cache_store *c;
    bbuf *b;
    size_t slot;
    int r;
    switch (s->kind) {
    case OP_BATCH:
        return gather(it, i, out, e);
    case OP_MAP:
        if ((r = batch_next(it, i - 1, &b, e)) != PULL_ELEM)
            return r;
        if (b->x != b->sx) { /* a cache's batch: change a copy */
            memcpy(b->sx, b->x, b->rows * ds->xd * sizeof(float));
            if (ds->ysz)
                memcpy(b->sy, b->y, b->rows * ds->ysz);
            b->x = b->sx;
            b->y = b->sy;
        }
        if ((r = s->op->fn(b->x, b->y, b->rows, ds->xd, s->op->user)) != 0) {
            pool_put(it, b);
            return map_failed(it, i, r, "batch", s->pos, SIZE_MAX, e);
        }
        s->pos++;
        *out = b;
        return PULL_ELEM;
    case OP_SHUFFLE:
        if ((r = shuf_next(it, i, &slot, e)) != PULL_ELEM)
            return r;
        *out = s->sb[slot];
        return PULL_ELEM;
    case OP_CACHE:
        c = &s->op->cache;
        if (s->replay) {
            if (s->pos >= c->count)
                return PULL_END;
            if (!(b = pool_get(it, e)))
                return PULL_ERR;
            size_t k = s->pos++;
            b->x = c->x + c->off[k] * ds->xd;
            b->y = ds->ysz ? c->y + c->off[k] * ds->ysz : NULL;
            b->rows = c->rows[k];
            *out = b;
            return PULL_ELEM;
        }
        if ((r = batch_next(it, i - 1, &b, e)) != PULL_ELEM) {
            if (r == PULL_END && c->count == s->card)
                c->complete = 1;
            return r;
        }
        if (c->count < s->card) {
            size_t k = c->count++;
            c->off[k] = c->nrows;
            c->rows[k] = b->rows;
            memcpy(c->x + c->nrows * ds->xd, b->x, b->rows * ds->xd * sizeof(float));
            if (ds->ysz)
                memcpy(c->y + c->nrows * ds->ysz, b->y, b->rows * ds->ysz);
            c->nrows += b->rows;
            if (c->count == s->card)
                c->complete = 1;
        }
        *out = b;
        return PULL_ELEM;
    }
    return PULL_ERR;
}

/* Skips k elements of stage i as cheaply as its kind allows: the source and
 * a replaying cache move a position, a map passes the skip up without
 * calling back (the values are dropped anyway), a shuffle or a filling cache
 * has to pull. *done: how many were skipped (< k at the end of the epoch). */
static int row_skip(tpu_dataset_iter *it, int i, size_t k, size_t *done, err *e)
{
    *done = 0;
    if (i < 0) {
        *done = min_sz(k, it->ds->n - it->src_pos);
        it->src_pos += *done;
        return PULL_ELEM;
    }
    struct stage *s = &it->st[i];
    if (s->kind == OP_MAP) {
        int r = row_skip(it, i - 1, k, done, e);
        s->pos += *done;
        return r;
    }
    if (s->kind == OP_CACHE && s->replay) {
        *done = min_sz(k, s->op->cache.count - min_sz(s->pos, s->op->cache.count));
        s->pos += *done;
        return PULL_ELEM;
    }
    for (; *done < k; ++*done) {
        relem el;
        int r;
        if (cancelled(it, e))
            return PULL_ERR;
        if ((r = row_next(it, i, &el, e)) != PULL_ELEM)
            return r;
    }
    return PULL_ELEM;
}

static int batch_skip(tpu_dataset_iter *it, int i, size_t k, size_t *done, err *e)
{
    struct stage *s = &it->st[i];
    int r;
    *done = 0;
    if (s->kind == OP_BATCH) {
        size_t rows, full = s->card / s->bs; /* k <= full: k * bs <= n, no overflow */
        rows = k <= full ? k * s->bs : s->card;
        if ((r = row_skip(it, i - 1, rows, &rows, e)) < 0)
            return r;
        *done = min_sz(k, rows / s->bs + (!s->drop && rows % s->bs != 0));
        s->pos += *done;
        return PULL_ELEM;
    }
    if (s->kind == OP_MAP) {
        r = batch_skip(it, i - 1, k, done, e);
        s->pos += *done;
        return r;
    }
    if (s->kind == OP_CACHE && s->replay) {
        *done = min_sz(k, s->op->cache.count - min_sz(s->pos, s->op->cache.count));
        s->pos += *done;
        return PULL_ELEM;
    }
    for (; *done < k; ++*done) {
        bbuf *b;
        if ((r = batch_next(it, i, &b, e)) != PULL_ELEM)
            return r;
        pool_put(it, b);
    }
    return PULL_ELEM;
}

/* One element of the last stage, after the skip on the first call. */
static int produce(tpu_dataset_iter *it, bbuf **out, err *e)
{
    int r;
    if (!it->started) {
        it->started = 1;
        it->next_index = it->skip;
        size_t done;
        if (it->skip && (r = batch_skip(it, it->nst - 1, it->skip, &done, e)) < 0)
            return r;
    }
    if ((r = batch_next(it, it->nst - 1, out, e)) == PULL_ELEM)
        (*out)->index = it->next_index++;
    return r;
}

/* ---- prefetch ---- */

static void *prefetch_main(void *arg)
{
    tpu_dataset_iter *it = arg;
    err e;
    for (;;) {
        bbuf *b = NULL;
        err_clear(&e);
        int r = produce(it, &b, &e);
        pthread_mutex_lock(&it->mu);
        if (r != PULL_ELEM) {
            if (r < 0 && !atomic_load(&it->stop)) {
                it->prod_failed = 1;
                it->perr = e;
            }
            it->prod_done = 1;
            pthread_cond_broadcast(&it->cv_cons);
            pthread_mutex_unlock(&it->mu);
            break;
        }
        while (it->qlen >= (size_t)atomic_load(&it->depth) && !atomic_load(&it->stop))
            pthread_cond_wait(&it->cv_prod, &it->mu);
        if (atomic_load(&it->stop)) {
            b->next = it->pool;
            it->pool = b;
            pthread_mutex_unlock(&it->mu);
            break;
        }
        it->q[(it->qhead + it->qlen++) % it->qcap] = b;
        pthread_cond_signal(&it->cv_cons);
        pthread_mutex_unlock(&it->mu);
    }
    return NULL;
}

static int take(tpu_dataset_iter *it, bbuf **out, err *e)
{
    int r;
    pthread_mutex_lock(&it->mu);
    if (it->qlen == 0 && !it->prod_done && it->autotune && it->taken >= 1) {
        int d = atomic_load(&it->depth);
        if (d < AUTOTUNE_MAX) {
            atomic_store(&it->depth, d + 1);
            pthread_cond_signal(&it->cv_prod);
        }
    }
    while (it->qlen == 0 && !it->prod_done)
        pthread_cond_wait(&it->cv_cons, &it->mu);
    if (it->qlen) {
        *out = it->q[it->qhead];
        it->qhead = (it->qhead + 1) % it->qcap;
        it->qlen--;
        it->taken++;
        pthread_cond_signal(&it->cv_prod);
        r = PULL_ELEM;
    } else if (it->prod_failed) {
        *e = it->perr;
        r = PULL_ERR;
    } else {
        r = PULL_END;
    }
    pthread_mutex_unlock(&it->mu);
    return r;
}

/* ---- iterator ---- */

static void stage_release(struct stage *s)
{
    free(s->sidx);
    free(s->sslot);
    free(s->sx);
    free(s->sy);
    free(s->sb);
    free(s->mx);
    free(s->my);
}

/* Buffers of stage s (shuffle slots, map scratch, a cache to fill). */
static int stage_init(tpu_dataset_iter *it, struct stage *s, int i, err *e)
{
    tpu_dataset *ds = it->ds;
    size_t xb = ds->xd * sizeof(float), card = s->card ? s->card : 1;
    int ok = 1;
    if (s->kind == OP_SHUFFLE) {
        s->cap = min_sz(s->op->buffer, card);
        rng_seed(s->rng, s->op->seed, it->epoch, (uint64_t)i);
        if (s->batched) {
            ok = (s->sb = calloc(s->cap, sizeof *s->sb)) != NULL;
        } else {
            ok = (s->sidx = malloc(s->cap * sizeof *s->sidx)) != NULL;
            if (ok && s->data) {
                s->sslot = malloc(s->cap * sizeof *s->sslot);
                s->sx = malloc(s->cap * xb);
                s->sy = ds->ysz ? malloc(s->cap * ds->ysz) : NULL;
                ok = s->sslot && s->sx && (!ds->ysz || s->sy);
                for (size_t k = 0; ok && k < s->cap; k++)
                    s->sslot[k] = k;
            }
        }
    } else if (s->kind == OP_MAP && !s->batched) {
        s->mx = malloc(xb);
        s->my = ds->ysz ? malloc(ds->ysz) : NULL;
        ok = s->mx && (!ds->ysz || s->my);
    } else if (s->kind == OP_CACHE) {
        struct cache_store *c = &ds->ops[i].cache;
        s->replay = c->complete;
        if (!c->complete) {
            c->count = c->nrows = 0;
            if (!s->batched && !c->idx)
                ok = (c->idx = malloc(card * sizeof *c->idx)) != NULL;
            size_t rows = s->batched ? (ds->drop ? s->card * ds->batch_size : ds->n) : (s->data ? ds->n : 0);
            if (ok && rows && !c->x) {
                c->x = malloc(rows * xb);
                c->y = ds->ysz ? malloc(rows * ds->ysz) : NULL;
                ok = c->x && (!ds->ysz || c->y);
            }
            if (ok && s->batched && !c->off) {
                c->off = malloc(card * sizeof *c->off);
                c->rows = malloc(card * sizeof *c->rows);
                ok = c->off && c->rows;
            }
            if (!ok)
                cache_release(c);
        }
    }
    if (!ok)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "tpu_dataset_iter_new: out of memory for transformation %d "
                       "(%s)", i, op_names[s->kind]);
    return CODE_OK;
}

tpu_status tpu_dataset_iter_new(tpu_dataset *ds, uint64_t epoch, size_t skip, tpu_dataset_iter **out)
{
    err e;
    err_clear(&e);
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_dataset_iter_new: out is NULL");
    *out = NULL;
    dataset_of(ds);
    int none = 0;
    if (!atomic_compare_exchange_strong(&ds->iters, &none, 1))
        return cli_failf(TPU_FAILED_PRECONDITION, "tpu_dataset_iter_new: the dataset has a live iterator; a "
                         "dataset is iterated by one iterator at a time (free the other first)");
    tpu_dataset_iter *it = calloc(1, sizeof *it);
    int nst = (int)ds->nops + (ds->batch_size ? 0 : 1);
    if (!it || !(it->st = calloc((size_t)(nst ? nst : 1), sizeof *it->st))) {
        free(it);
        atomic_store(&ds->iters, 0);
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "tpu_dataset_iter_new: out of memory");
    }
    it->magic = MAGIC_ITER;
    it->ds = ds;
    it->epoch = epoch;
    it->skip = skip;
    it->nst = nst;
    it->bcap = ds->batch_size ? min_sz(ds->batch_size, ds->n) : 1;
    if (ds->files) {
        it->nst = 0;
        it->bcap = ds->on_hosts ? 1 : ds->batch_size;
        it->next_index = skip;
    }
    pthread_mutex_init(&it->mu, NULL);
    pthread_cond_init(&it->cv_cons, NULL);
    pthread_cond_init(&it->cv_prod, NULL);
    atomic_init(&it->stop, 0);
    atomic_init(&it->depth, 0);

    size_t nb = tpu_dataset_num_batches(ds);
    int data = 0;
    if (ds->files && !ds->on_hosts && !ds->pipes) {
        if (!(ds->pipes = calloc(ds->fnum, sizeof *ds->pipes)))
            err_set(&e, CODE_RESOURCE_EXHAUSTED, "tpu_dataset_iter_new: out of memory");
        for (uint32_t r = 0; r < ds->fnum && e.code == CODE_OK; r++)
            if (hin_open(ds->files, r, ds->fnum, &ds->pipes[r], &e) != CODE_OK)
                err_prefix(&e, "input pipeline %u of %u", (unsigned)r, (unsigned)ds->fnum);
        if (e.code != CODE_OK) {
            for (uint32_t r = 0; ds->pipes && r < ds->fnum; r++)
                hin_close(ds->pipes[r]);
            free(ds->pipes);
            ds->pipes = NULL;
        }
    }
    for (int i = 0; i < it->nst && e.code == CODE_OK; i++) {
        struct stage *s = &it->st[i];
        if ((size_t)i < ds->nops) {
            s->op = &ds->ops[i];
            s->kind = s->op->kind;
            s->batched = s->op->batched;
            s->bs = s->op->batch_size;
            s->drop = s->op->drop;
        } else { /* unbatched: the consumer gets one row per element */
            s->kind = OP_BATCH;
            s->bs = 1;
        }
        s->data = data;
        s->card = s->batched ? nb : ds->n;
        if (s->kind == OP_MAP && !s->batched)
            data = 1;
        stage_init(it, s, i, &e);
    }
    if (e.code == CODE_OK && ds->prefetch) {
        it->threaded = 1;
        it->autotune = ds->prefetch == TPU_AUTOTUNE;
        it->qcap = it->autotune ? AUTOTUNE_MAX : (size_t)ds->prefetch;
        atomic_store(&it->depth, it->autotune ? AUTOTUNE_START : ds->prefetch);
        if (!(it->q = calloc(it->qcap, sizeof *it->q)))
            err_set(&e, CODE_RESOURCE_EXHAUSTED, "tpu_dataset_iter_new: out of memory");
        else if (pthread_create(&it->th, NULL, prefetch_main, it) != 0) {
            it->threaded = 0;
            err_set(&e, CODE_RESOURCE_EXHAUSTED, "tpu_dataset_iter_new: cannot start the prefetch thread");
        }
    }
    if (e.code != CODE_OK) {
        it->threaded = 0;
        tpu_dataset_iter_free(it);
        return cli_fail(&e);
    }
    *out = it;
    return TPU_OK;
}

/* The next global batch of a dataset distributed from files. */
static int files_next(tpu_dataset_iter *it, bbuf **out, err *e)
{
    tpu_dataset *ds = it->ds;
    size_t per = ds->batch_size / ds->fnum;
    if (it->next_index >= tpu_dataset_num_batches(ds))
        return PULL_END;
    bbuf *b = pool_get(it, e);
    if (!b)
        return PULL_ERR;
    b->index = it->next_index;
    b->rows = ds->batch_size;
    if (ds->on_hosts) {
        b->x = NULL;
        b->y = NULL;
    } else {
        for (uint32_t r = 0; r < ds->fnum; r++)
            if (hin_fill(ds->pipes[r], it->epoch, b->index, b->x + (size_t)r * per * ds->xd,
                         (int32_t *)(void *)(b->y + (size_t)r * per * ds->ysz), e) != CODE_OK) {
                pool_put(it, b);
                return PULL_ERR;
            }
    }
    it->next_index++;
    *out = b;
    return PULL_ELEM;
}

tpu_status tpu_dataset_iter_next(tpu_dataset_iter *it, tpu_batch *b)
{
    CHECK_HANDLE(it, MAGIC_ITER, "tpu_dataset_iter");
    if (!b)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_dataset_iter_next: b is NULL");
    memset(b, 0, sizeof *b);
    if (it->failed)
        return cli_fail(&it->ferr);
    if (it->held >= TPU_MAX_HELD_BATCHES)
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "tpu_dataset_iter_next: %d batches are held already; release "
                         "one (tpu_dataset_iter_release) before asking for more", TPU_MAX_HELD_BATCHES);
    uint64_t t0 = now_ns();
    bbuf *bb = NULL;
    err e;
    err_clear(&e);
    int r = it->ds->files ? files_next(it, &bb, &e) : it->threaded ? take(it, &bb, &e) : produce(it, &bb, &e);
    b->wait_ns = now_ns() - t0;
    if (r < 0) {
        it->failed = 1;
        it->ferr = e;
        return cli_fail(&e);
    }
    if (r == PULL_END) {
        b->index = it->threaded ? it->skip + it->taken : it->next_index;
        return TPU_OK;
    }
    bb->held = 1;
    it->held++;
    b->x = bb->x;
    b->y = bb->y;
    b->rows = bb->rows;
    b->index = bb->index;
    b->opaque_ = bb;
    return TPU_OK;
}

void tpu_dataset_iter_release(tpu_dataset_iter *it, tpu_batch *b)
{
    CHECK_HANDLE(it, MAGIC_ITER, "tpu_dataset_iter");
    if (!b || !b->opaque_)
        return;
    bbuf *bb = b->opaque_;
    if (bb->owner != it || !bb->held) {
        fprintf(stderr, "libtpuclient: fatal: tpu_dataset_iter_release: batch %zu is %s\n", b->index,
                bb->owner != it ? "not from this iterator" : "released already");
        abort();
    }
    bb->held = 0;
    it->held--;
    pool_put(it, bb);
    memset(b, 0, sizeof *b);
}

void tpu_dataset_iter_free(tpu_dataset_iter *it)
{
    if (!it)
        return;
    CHECK_HANDLE(it, MAGIC_ITER, "tpu_dataset_iter");
    if (it->threaded) {
        pthread_mutex_lock(&it->mu);
        atomic_store(&it->stop, 1);
        pthread_cond_broadcast(&it->cv_prod);
        pthread_cond_broadcast(&it->cv_cons);
        pthread_mutex_unlock(&it->mu);
        pthread_join(it->th, NULL);
    }
    for (int i = 0; i < it->nst; i++)
        stage_release(&it->st[i]);
    free(it->st);
    for (bbuf *b = it->all, *next; b; b = next) {
        next = b->all;
        free(b->sx);
        free(b->sy);
        free(b);
    }
    free(it->q);
    pthread_cond_destroy(&it->cv_prod);
    pthread_cond_destroy(&it->cv_cons);
    pthread_mutex_destroy(&it->mu);
    atomic_store(&it->ds->iters, 0);
    it->magic = MAGIC_DEAD;
    free(it);
}

int tpu_dataset_iter_prefetch_depth(const tpu_dataset_iter *it)
{
    CHECK_HANDLE(it, MAGIC_ITER, "tpu_dataset_iter");
    return it->threaded ? atomic_load(&((tpu_dataset_iter *)it)->depth) : 0;
}

int dataset_from_files(const struct hin_spec *s, uint32_t num, int on_hosts, tpu_dataset **out, err *e)
{
    tpu_dataset *ds;
    *out = NULL;
    if (!(ds = calloc(1, sizeof *ds)) || !(ds->files = malloc(sizeof *ds->files))) {
        free(ds);
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    }
    *ds->files = *s;
    ds->magic = MAGIC_DATASET;
    ds->fnum = num;
    ds->on_hosts = on_hosts;
    ds->n = (size_t)s->rows;
    ds->xd = s->x_dim;
    ds->yd = 1;
    ds->ysz = sizeof(int32_t);
    ds->kind = TPU_LABELS_SPARSE;
    ds->batch_size = (size_t)hin_batch_size(s) * num;
    ds->drop = 1;
    atomic_init(&ds->iters, 0);
    *out = ds;
    return CODE_OK;
}

const struct hin_spec *dataset_files(const tpu_dataset *ds, uint32_t *num, int *on_hosts)
{
    const tpu_dataset *d = dataset_of(ds);
    if (num)
        *num = d->fnum;
    if (on_hosts)
        *on_hosts = d->on_hosts;
    return d->files;
}
