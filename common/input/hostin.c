/* Input pipelines on the hosts (hostin.h). A pipeline keeps its shard of the
 * files' rows (unsigned bytes, or the mapped floats when the spec caches
 * them), computes each epoch's order once as a plan of row indices (the
 * buffered shuffles run over indices, so a batch can be addressed directly),
 * and gathers a batch by mapping or copying its rows. A prefetch thread
 * fills the next batches ahead into a ring the consumer copies from.
 * Compiled without FMA contraction: the client and every host map a pixel
 * with the same roundings. */
#include "hostin.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "idx.h"
#include "rng.h"

const char *hin_op_name(int kind)
{
    switch (kind) {
    case HIN_MAP_SCALE:
        return "map(scale)";
    case HIN_MAP_SHIFT:
        return "map(shift)";
    case HIN_MAP_NORMALIZE:
        return "map(normalize)";
    case HIN_SHUFFLE:
        return "shuffle";
    case HIN_BATCH:
        return "batch";
    case HIN_CACHE:
        return "cache";
    case HIN_PREFETCH:
        return "prefetch";
    default:
        return "an unknown op";
    }
}

static int is_map(int kind)
{
    return kind == HIN_MAP_SCALE || kind == HIN_MAP_SHIFT || kind == HIN_MAP_NORMALIZE;
}

int hin_spec_check(const struct hin_spec *s, err *e)
{
    int batch = -1, shuf_before = 0, shuf_after = 0, cache = 0;
    if (!memchr(s->images, 0, sizeof s->images) || !memchr(s->labels, 0, sizeof s->labels))
        return err_set(e, CODE_INVALID_ARGUMENT, "input spec: a file name is longer than %d bytes", HIN_PATH_MAX - 1);
    if (!s->images[0] || !s->labels[0])
        return err_set(e, CODE_INVALID_ARGUMENT, "input spec: no %s file", !s->images[0] ? "images" : "labels");
    if (s->nops > HIN_MAX_OPS)
        return err_set(e, CODE_INVALID_ARGUMENT, "input spec: %zu ops; at most %d", s->nops, HIN_MAX_OPS);
    if (s->rows == 0 || s->x_dim == 0 || s->rows > (4ull << 30) / s->x_dim)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "input spec: %llu rows of %u values is not a dataset of 1 to 4 GiB "
                       "of pixels",
                       (unsigned long long)s->rows, (unsigned)s->x_dim);
    for (size_t i = 0; i < s->nops; i++) {
        const struct hin_op *o = &s->ops[i];
        const char *name = hin_op_name(o->kind);
        if (is_map(o->kind)) {
            if (batch >= 0)
                return err_set(e, CODE_INVALID_ARGUMENT,
                               "input spec: op %zu, %s, comes after batch(); the built-in "
                               "maps work on rows, before batch()",
                               i, name);
            if (!isfinite(o->a) || (o->kind == HIN_MAP_NORMALIZE && (!isfinite(o->b) || o->b == 0.0f)))
                return err_set(e, CODE_INVALID_ARGUMENT,
                               "input spec: op %zu, %s, has a parameter that is not a "
                               "finite number%s",
                               i, name, o->kind == HIN_MAP_NORMALIZE ? " or a zero deviation" : "");
        } else if (o->kind == HIN_SHUFFLE) {
            if (o->buffer == 0 || o->buffer > HIN_MAX_BUFFER)
                return err_set(e, CODE_INVALID_ARGUMENT, "input spec: op %zu, shuffle, has buffer %llu; 1..%llu", i,
                               (unsigned long long)o->buffer, (unsigned long long)HIN_MAX_BUFFER);
            if (batch < 0 ? shuf_before++ : shuf_after++)
                return err_set(e, CODE_INVALID_ARGUMENT, "input spec: op %zu: a second shuffle %s batch()", i,
                               batch < 0 ? "before" : "after");
        } else if (o->kind == HIN_BATCH) {
            if (batch >= 0)
                return err_set(e, CODE_INVALID_ARGUMENT, "input spec: op %zu: a second batch()", i);
            if (o->batch == 0 || o->batch > HIN_MAX_BATCH)
                return err_set(e, CODE_INVALID_ARGUMENT, "input spec: op %zu, batch, has %u rows; 1..%u", i,
                               (unsigned)o->batch, HIN_MAX_BATCH);
            batch = (int)i;
        } else if (o->kind == HIN_CACHE) {
            if (cache++)
                return err_set(e, CODE_INVALID_ARGUMENT, "input spec: op %zu: a second cache()", i);
        } else if (o->kind == HIN_PREFETCH) {
            if (i + 1 != s->nops)
                return err_set(e, CODE_INVALID_ARGUMENT, "input spec: op %zu, prefetch, must be the last", i);
            if (o->depth == 0 || o->depth > HIN_MAX_PREFETCH)
                return err_set(e, CODE_INVALID_ARGUMENT, "input spec: prefetch depth %u; 1..%d", (unsigned)o->depth,
                               HIN_MAX_PREFETCH);
        } else {
            return err_set(e, CODE_INVALID_ARGUMENT, "input spec: op %zu has unknown kind %d", i, o->kind);
        }
    }
    if (batch < 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "input spec: no batch(); host-side input needs the per-replica batch");
    return CODE_OK;
}

uint32_t hin_batch_size(const struct hin_spec *s)
{
    for (size_t i = 0; i < s->nops && i < HIN_MAX_OPS; i++)
        if (s->ops[i].kind == HIN_BATCH)
            return s->ops[i].batch;
    return 0;
}

/* Checks a file's header (or whole array) against what the spec needs. */
static int check_images(const char *path, const struct idx_array *a, err *e)
{
    if (a->dtype != 0x08)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "%s: IDX type 0x%02x; host-side input reads unsigned-byte (0x08) "
                       "images",
                       path, a->dtype);
    if (a->dims[0] == 0 || a->count / a->dims[0] == 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "%s: no images in it", path);
    return CODE_OK;
}

static int check_labels(const char *path, const struct idx_array *a, uint64_t rows, err *e)
{
    if (a->dtype != 0x08)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "%s: IDX type 0x%02x; host-side input reads unsigned-byte (0x08) "
                       "class ids",
                       path, a->dtype);
    if (a->rank != 1)
        return err_set(e, CODE_INVALID_ARGUMENT, "%s: rank %d; labels are one class id per row (rank 1)", path,
                       a->rank);
    if (a->dims[0] != rows)
        return err_set(e, CODE_INVALID_ARGUMENT, "%s: %zu labels for %llu images", path, a->dims[0],
                       (unsigned long long)rows);
    return CODE_OK;
}

int hin_probe(struct hin_spec *s, err *e)
{
    struct idx_array a;
    if (idx_read_header(s->images, &a, e) != CODE_OK || check_images(s->images, &a, e) != CODE_OK)
        return e->code;
    s->rows = a.dims[0];
    s->x_dim = (uint32_t)(a.count / a.dims[0]);
    if (idx_read_header(s->labels, &a, e) != CODE_OK || check_labels(s->labels, &a, s->rows, e) != CODE_OK)
        return e->code;
    return CODE_OK;
}

static uint64_t shard_rows(uint64_t rows, uint32_t id, uint32_t num)
{
    return id < rows ? (rows - id + num - 1) / num : 0;
}

uint64_t hin_batches(const struct hin_spec *s, uint32_t id, uint32_t num)
{
    uint32_t b = hin_batch_size(s);
    return b && num && id < num ? shard_rows(s->rows, id, num) / b : 0;
}

uint64_t hin_epoch_steps(const struct hin_spec *s, uint32_t num)
{
    return num ? hin_batches(s, num - 1, num) : 0; /* the last pipeline has the fewest rows */
}

/* tf.data's buffered shuffle of 0..n-1: fill a buffer, emit a uniformly
 * chosen slot, refill it from the input. */
static int buffered_shuffle(uint64_t *out, uint64_t n, uint64_t buffer, uint64_t seed, uint64_t epoch, uint64_t stage)
{
    uint64_t rng[4], cap = buffer < n ? buffer : n, count = cap, next = cap;
    uint64_t *b = malloc((size_t)(cap ? cap : 1) * sizeof *b);
    if (!b)
        return -1;
    rng_seed(rng, seed, epoch, stage);
    for (uint64_t i = 0; i < cap; i++)
        b[i] = i;
    for (uint64_t o = 0; o < n; o++) {
        uint64_t j = rng_below(rng, count);
        out[o] = b[j];
        if (next < n)
            b[j] = next++;
        else
            b[j] = b[--count];
    }
    free(b);
    return 0;
}

/* ---- pipelines ---- */

struct slot {
    uint64_t epoch, index;
    int state; /* 0 free, 1 being filled, 2 ready, 3 failed */
    float *x;
    int32_t *y;
};

struct hin_pipe {
    struct hin_spec s;
    uint32_t id, num, bs;
    uint64_t m, nb;
    unsigned char *img, *lab; /* the shard's rows, mapped as they are gathered */
    struct hin_op maps[HIN_MAX_OPS];
    size_t nmaps;
    const struct hin_op *rshuf, *bshuf;
    int rfrozen, bfrozen; /* a cache after the shuffle: epoch 0's order every epoch */
    /* the plan of one epoch (the caller's and the prefetch thread's, under mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int have_plan;
    uint64_t plan_epoch;
    uint64_t *order, *border;
    /* prefetch */
    uint32_t depth;
    struct slot *ring;
    int thread_on, stop;
    uint64_t want_epoch, want_index; /* the next batch the consumer will ask for */
    int want_set;
    pthread_t th;
};

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HIN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define HIN_CLONES
#endif

/* One row's maps, in order: each element takes the same operations in the
 * same order whatever the clone (this file is built without FMA contraction
 * and with -O3, so the loops vectorize), so every clone gives the same bits. */
HIN_CLONES
static void map_row(const struct hin_pipe *p, float *restrict x, const unsigned char *restrict px)
{
    uint32_t n = p->s.x_dim;
    for (uint32_t d = 0; d < n; d++)
        x[d] = (float)px[d];
    for (size_t k = 0; k < p->nmaps; k++) {
        const float a = p->maps[k].a, b = p->maps[k].b;
        if (p->maps[k].kind == HIN_MAP_SCALE)
            for (uint32_t d = 0; d < n; d++)
                x[d] = x[d] * a;
        else if (p->maps[k].kind == HIN_MAP_SHIFT)
            for (uint32_t d = 0; d < n; d++)
                x[d] = x[d] + a;
        else
            for (uint32_t d = 0; d < n; d++)
                x[d] = (x[d] - a) / b;
    }
}

/* Makes the plan of epoch (under mu). */
static int plan(struct hin_pipe *p, uint64_t epoch, err *e)
{
    if (p->have_plan && p->plan_epoch == epoch)
        return CODE_OK;
    if (p->rshuf && (p->have_plan ? !p->rfrozen : 1) &&
        buffered_shuffle(p->order, p->m, p->rshuf->buffer, p->rshuf->seed, p->rfrozen ? 0 : epoch, 0) != 0)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "input pipeline: out of memory for the shuffle buffer");
    if (p->bshuf && (p->have_plan ? !p->bfrozen : 1) &&
        buffered_shuffle(p->border, p->nb, p->bshuf->buffer, p->bshuf->seed, p->bfrozen ? 0 : epoch, 1) != 0)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "input pipeline: out of memory for the shuffle buffer");
    p->have_plan = 1;
    p->plan_epoch = epoch;
    return CODE_OK;
}

/* Gathers batch index of the planned epoch (the plan must stay while it runs). */
static void gather(const struct hin_pipe *p, uint64_t index, float *x, int32_t *y)
{
    uint64_t bi = p->bshuf ? p->border[index] : index;
    size_t xd = p->s.x_dim;
    for (uint32_t r = 0; r < p->bs; r++) {
        uint64_t k = bi * p->bs + r, j = p->rshuf ? p->order[k] : k;
        map_row(p, x + (size_t)r * xd, p->img + (size_t)j * xd);
        y[r] = p->lab[j];
    }
}

static struct slot *slot_of(struct hin_pipe *p, uint64_t epoch, uint64_t index)
{
    for (uint32_t i = 0; i < p->depth; i++)
        if (p->ring[i].state >= 1 && p->ring[i].epoch == epoch && p->ring[i].index == index)
            return &p->ring[i];
    return NULL;
}

/* The prefetch thread: keeps the batches after the last one asked for ready. */
static void *prefetch_main(void *arg)
{
    struct hin_pipe *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        struct slot *free_slot = NULL;
        uint64_t idx = 0, ep = p->want_epoch;
        if (p->want_set) {
            for (uint64_t k = p->want_index; k < p->nb && k < p->want_index + p->depth; k++)
                if (!slot_of(p, ep, k)) {
                    idx = k;
                    for (uint32_t i = 0; i < p->depth && !free_slot; i++) {
                        struct slot *sl = &p->ring[i];
                        if (sl->state == 0 || (sl->state >= 2 && (sl->epoch != ep || sl->index < p->want_index ||
                                                                  sl->index >= p->want_index + p->depth)))
                            free_slot = sl;
                    }
                    break;
                }
        }
        if (!free_slot) {
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        err e;
        free_slot->epoch = ep;
        free_slot->index = idx;
        if (plan(p, ep, &e) != CODE_OK) {
            free_slot->state = 3;
            pthread_cond_broadcast(&p->cv);
            continue;
        }
        free_slot->state = 1;
        /* the plan is only replaced under mu by a consumer asking for another
         * epoch, which first waits for the slot being filled */
        pthread_mutex_unlock(&p->mu);
        gather(p, idx, free_slot->x, free_slot->y);
        pthread_mutex_lock(&p->mu);
        free_slot->state = 2;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Does a batch() come before op i? */
static int batch_before(const struct hin_spec *s, size_t i)
{
    for (size_t k = 0; k < i; k++)
        if (s->ops[k].kind == HIN_BATCH)
            return 1;
    return 0;
}

static int take_shard(struct hin_pipe *p, const struct idx_array *img, const struct idx_array *lab, err *e)
{
    size_t xd = p->s.x_dim;
    p->img = malloc((size_t)(p->m ? p->m : 1) * xd);
    p->lab = malloc((size_t)(p->m ? p->m : 1));
    if (!p->img || !p->lab)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "input pipeline: out of memory for %llu rows",
                       (unsigned long long)p->m);
    for (uint64_t j = 0; j < p->m; j++) {
        uint64_t src = p->id + j * p->num;
        memcpy(p->img + (size_t)j * xd, (const unsigned char *)img->data + (size_t)src * xd, xd);
        p->lab[j] = ((const unsigned char *)lab->data)[src];
    }
    return CODE_OK;
}

int hin_open(const struct hin_spec *s, uint32_t id, uint32_t num, struct hin_pipe **out, err *e)
{
    struct idx_array img, lab;
    struct hin_pipe *p;
    int rc;
    *out = NULL;
    if (hin_spec_check(s, e) != CODE_OK)
        return e->code;
    if (num == 0 || id >= num)
        return err_set(e, CODE_INVALID_ARGUMENT, "input pipeline %u of %u does not exist", (unsigned)id, (unsigned)num);
    if (!(p = calloc(1, sizeof *p)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "input pipeline: out of memory");
    p->s = *s;
    p->id = id;
    p->num = num;
    p->bs = hin_batch_size(s);
    p->m = shard_rows(s->rows, id, num);
    p->nb = p->m / p->bs;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (size_t i = 0; i < s->nops; i++) {
        const struct hin_op *o = &s->ops[i];
        if (is_map(o->kind))
            p->maps[p->nmaps++] = *o;
        else if (o->kind == HIN_SHUFFLE && !batch_before(s, i))
            p->rshuf = o;
        else if (o->kind == HIN_SHUFFLE)
            p->bshuf = o;
        else if (o->kind == HIN_CACHE)
            /* what it freezes; the shard's bytes are in memory anyway, and
             * mapping a row as it is gathered reads a quarter of the memory
             * a copy of the mapped floats would */
            p->rfrozen = p->rshuf != NULL, p->bfrozen = p->bshuf != NULL;
        else if (o->kind == HIN_PREFETCH)
            p->depth = o->depth;
    }
    if (p->rshuf)
        p->rshuf = &p->s.ops[p->rshuf - s->ops];
    if (p->bshuf)
        p->bshuf = &p->s.ops[p->bshuf - s->ops];
    memset(&img, 0, sizeof img);
    memset(&lab, 0, sizeof lab);
    if ((rc = idx_read(s->images, &img, e)) != CODE_OK || (rc = check_images(s->images, &img, e)) != CODE_OK)
        goto fail;
    if (img.dims[0] != s->rows || img.count / img.dims[0] != s->x_dim) {
        rc = err_set(e, CODE_INVALID_ARGUMENT,
                     "%s: %zu images of %zu values here; the spec says %llu of %u (every "
                     "host must read the same files)",
                     s->images, img.dims[0], img.count / img.dims[0], (unsigned long long)s->rows, (unsigned)s->x_dim);
        goto fail;
    }
    if ((rc = idx_read(s->labels, &lab, e)) != CODE_OK || (rc = check_labels(s->labels, &lab, s->rows, e)) != CODE_OK)
        goto fail;
    if ((rc = take_shard(p, &img, &lab, e)) != CODE_OK)
        goto fail;
    idx_clear(&img);
    idx_clear(&lab);
    p->order = malloc((size_t)(p->m ? p->m : 1) * sizeof *p->order);
    p->border = malloc((size_t)(p->nb ? p->nb : 1) * sizeof *p->border);
    if (!p->order || !p->border) {
        rc = err_set(e, CODE_RESOURCE_EXHAUSTED, "input pipeline: out of memory for its plan");
        goto fail;
    }
    if (p->depth) {
        if (!(p->ring = calloc(p->depth, sizeof *p->ring))) {
            rc = err_set(e, CODE_RESOURCE_EXHAUSTED, "input pipeline: out of memory for prefetch");
            goto fail;
        }
        for (uint32_t i = 0; i < p->depth; i++) {
            p->ring[i].x = malloc((size_t)p->bs * s->x_dim * sizeof(float));
            p->ring[i].y = malloc((size_t)p->bs * sizeof(int32_t));
            if (!p->ring[i].x || !p->ring[i].y) {
                rc = err_set(e, CODE_RESOURCE_EXHAUSTED, "input pipeline: out of memory for prefetch");
                goto fail;
            }
        }
        if (pthread_create(&p->th, NULL, prefetch_main, p) != 0) {
            rc = err_set(e, CODE_RESOURCE_EXHAUSTED, "input pipeline: cannot start its prefetch thread");
            goto fail;
        }
        p->thread_on = 1;
    }
    *out = p;
    return CODE_OK;
fail:
    idx_clear(&img);
    idx_clear(&lab);
    hin_close(p);
    return rc;
}

int hin_is(const struct hin_pipe *p, const struct hin_spec *s, uint32_t id, uint32_t num)
{
    if (!p || p->id != id || p->num != num || p->s.rows != s->rows || p->s.x_dim != s->x_dim || p->s.nops != s->nops ||
        strcmp(p->s.images, s->images) || strcmp(p->s.labels, s->labels))
        return 0;
    for (size_t i = 0; i < s->nops; i++) {
        const struct hin_op *a = &p->s.ops[i], *b = &s->ops[i];
        if (a->kind != b->kind || memcmp(&a->a, &b->a, sizeof a->a) || memcmp(&a->b, &b->b, sizeof a->b) ||
            a->buffer != b->buffer || a->seed != b->seed || a->batch != b->batch || a->depth != b->depth)
            return 0;
    }
    return 1;
}

int hin_ready(struct hin_pipe *p, uint64_t epoch, uint64_t index)
{
    if (!p->thread_on)
        return 0;
    pthread_mutex_lock(&p->mu);
    const struct slot *sl = slot_of(p, epoch, index);
    int ready = sl && sl->state == 2;
    pthread_mutex_unlock(&p->mu);
    return ready;
}

int hin_fill(struct hin_pipe *p, uint64_t epoch, uint64_t index, float *x, int32_t *y, err *e)
{
    int rc = CODE_OK;
    if (index >= p->nb)
        return err_set(e, CODE_OUT_OF_RANGE,
                       "input pipeline %u of %u: batch %llu of epoch %llu is past its %llu "
                       "batches",
                       (unsigned)p->id, (unsigned)p->num, (unsigned long long)index, (unsigned long long)epoch,
                       (unsigned long long)p->nb);
    pthread_mutex_lock(&p->mu);
    struct slot *sl = p->thread_on ? slot_of(p, epoch, index) : NULL;
    while (sl && sl->state == 1) {
        pthread_cond_wait(&p->cv, &p->mu);
        sl = slot_of(p, epoch, index);
    }
    if (sl && sl->state == 2) {
        memcpy(x, sl->x, (size_t)p->bs * p->s.x_dim * sizeof(float));
        memcpy(y, sl->y, (size_t)p->bs * sizeof(int32_t));
        sl->state = 0;
    } else {
        /* not prefetched: the thread must not gather while the plan changes */
        for (uint32_t i = 0; i < p->depth; i++)
            while (p->ring[i].state == 1)
                pthread_cond_wait(&p->cv, &p->mu);
        if ((rc = plan(p, epoch, e)) == CODE_OK)
            gather(p, index, x, y);
    }
    if (p->thread_on && rc == CODE_OK) {
        p->want_epoch = epoch;
        p->want_index = index + 1;
        p->want_set = 1;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void hin_close(struct hin_pipe *p)
{
    if (!p)
        return;
    if (p->thread_on) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->th, NULL);
    }
    for (uint32_t i = 0; p->ring && i < p->depth; i++) {
        free(p->ring[i].x);
        free(p->ring[i].y);
    }
    free(p->ring);
    free(p->img);
    free(p->lab);
    free(p->order);
    free(p->border);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
