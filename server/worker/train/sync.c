/* Synchronized BatchNormalization's sums over the replicas (train_int.h):
 * the core, below the collectives, calls sync_allreduce (the hook
 * model_set_allreduce gave it) from the pool's thread in the middle of a
 * step; the collectives run on the loop, so the call is posted to the loop
 * (an async handle), submitted there as an all-reduce, and the pool's
 * thread waits for its answer. The collectives number them: step i of a
 * STEPS request uses coll_seq + i (1 + S) .. + S - 1 for its S sums, in the
 * order the core makes them, and coll_seq + i (1 + S) + S for its
 * gradients, as the client reserved them. */
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "train_int.h"

/* beyond the collectives' own stall timeout, which fails a sum first */
#define SYNC_WAIT_NS (120ull * 1000000000ull)

struct sync_call {
    struct train *t;
    float *buf;
    size_t n;
    uint64_t seq, epoch;
    int done, abandoned;
    err e;
};

/* on the loop: the sum's answer; wakes the pool's thread (or frees a call it gave up on) */
static void on_sync_done(void *arg, const err *e, const uint8_t *out, size_t out_len)
{
    struct sync_call *c = arg;
    struct train *t = c->t;
    uv_mutex_lock(&t->sync_mu);
    if (c->abandoned) {
        uv_mutex_unlock(&t->sync_mu);
        free(c);
        return;
    }
    if (e->code == CODE_OK && out && out != (const uint8_t *)c->buf && out_len == c->n * sizeof(float))
        memcpy(c->buf, out, out_len);
    c->e = *e;
    c->done = 1;
    uv_cond_broadcast(&t->sync_cv);
    uv_mutex_unlock(&t->sync_mu);
}

static void on_async(uv_async_t *h)
{
    struct train *t = h->data;
    struct sync_call *c;
    uv_mutex_lock(&t->sync_mu);
    c = t->sync_req;
    t->sync_req = NULL;
    uv_mutex_unlock(&t->sync_mu);
    if (!c)
        return;
    Tpuemu__FrameHeader fh = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__CollSpec cs = TPUEMU__COLL_SPEC__INIT;
    cs.kind = TPUEMU__COLL_KIND__COLL_ALL_REDUCE;
    cs.op = TPUEMU__REDUCE_OP__REDUCE_SUM;
    cs.dtype = TPUEMU__DTYPE__DTYPE_F32;
    cs.count = c->n;
    fh.kind = KIND(COLL);
    fh.epoch = c->epoch;
    fh.seq = c->seq;
    fh.coll = &cs;
    coll_submit(t->env.coll, &fh, (uint8_t *)c->buf, c->n * sizeof(float), on_sync_done, c);
}

int sync_init(struct train *t)
{
    int rc;
    if (!(t->sync_async = calloc(1, sizeof *t->sync_async)))
        return CODE_RESOURCE_EXHAUSTED;
    if ((rc = uv_async_init(t->env.loop, t->sync_async, on_async)) < 0) {
        free(t->sync_async);
        t->sync_async = NULL;
        return CODE_INTERNAL;
    }
    t->sync_async->data = t;
    uv_unref((uv_handle_t *)t->sync_async); /* the loop's other handles keep it running */
    uv_mutex_init(&t->sync_mu);
    uv_cond_init(&t->sync_cv);
    return CODE_OK;
}

static void free_handle(uv_handle_t *h)
{
    free(h);
}

void sync_close(struct train *t)
{
    if (!t->sync_async)
        return;
    uv_mutex_lock(&t->sync_mu);
    t->sync_closed = 1;
    uv_cond_broadcast(&t->sync_cv);
    uv_mutex_unlock(&t->sync_mu);
    uv_close((uv_handle_t *)t->sync_async, free_handle);
}

void sync_destroy(struct train *t)
{
    if (!t->sync_async && !t->sync_closed)
        return;
    uv_mutex_destroy(&t->sync_mu);
    uv_cond_destroy(&t->sync_cv);
}

void sync_begin_step(struct train *t, uint64_t first_seq, uint64_t epoch)
{
    t->sync_seq = first_seq;
    t->sync_epoch = epoch;
}

int sync_allreduce(void *ctx, float *buf, size_t n, err *e)
{
    struct train *t = ctx;
    struct sync_call *c = calloc(1, sizeof *c);
    uint64_t deadline = uv_hrtime() + SYNC_WAIT_NS;
    int rc;
    if (!c)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for a sum over the replicas");
    c->t = t;
    c->buf = buf;
    c->n = n;
    c->seq = t->sync_seq++;
    c->epoch = t->sync_epoch;
    uv_mutex_lock(&t->sync_mu);
    if (t->sync_closed) {
        uv_mutex_unlock(&t->sync_mu);
        free(c);
        return err_set(e, CODE_ABORTED, "the core is stopping");
    }
    t->sync_req = c;
    uv_async_send(t->sync_async);
    while (!c->done && !t->sync_closed) {
        uint64_t now = uv_hrtime();
        if (now >= deadline || uv_cond_timedwait(&t->sync_cv, &t->sync_mu, deadline - now) == UV_ETIMEDOUT)
            break;
    }
    if (!c->done) {
        /* the answer may still come: the loop frees the call then, or now if it never took it */
        int taken = t->sync_req != c;
        if (!taken)
            t->sync_req = NULL;
        c->abandoned = taken;
        uv_mutex_unlock(&t->sync_mu);
        if (!taken)
            free(c);
        return err_set(e, t->sync_closed ? CODE_ABORTED : CODE_DEADLINE_EXCEEDED,
                       t->sync_closed ? "the core is stopping"
                                      : "the replicas' sum for synchronized BatchNormalization did not come back");
    }
    uv_mutex_unlock(&t->sync_mu);
    rc = c->e.code;
    if (rc != CODE_OK)
        *e = c->e;
    free(c);
    return rc;
}
