/* The step machine of the training service:
 *
 *   loop: STEPS -> pool: [pending update] forward + backward
 *   loop: all-reduce gradients (coll_submit) -> next step, or answer.
 *
 * A small step runs on the loop thread itself (run_step): handing it to the
 * pool and back costs two thread wake-ups, which on a busy machine take
 * longer than the step (4 workers at per-core batch 128 on 2 CPUs: the
 * step's compute is ~0.2 ms). A step is small when the previous one's
 * compute took under INLINE_MAX_NS; the first step, a throttled core or one
 * slowed by TPUEMU_TEST_STEP_MS (its sleep would stall the loop) use the
 * pool. On a single-core system no all-reduce returns to the loop between
 * steps: the next step (of this request, or of the next one already read)
 * would run nested on the loop's stack, so at most INLINE_NEST of them do and
 * then one goes to the pool, which lets the loop run its connections and
 * timers at least every INLINE_NEST small steps.
 *
 * Updates are applied lazily, right before the model is next used. State
 * reads and writes run on the loop thread: they are short. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "bf16.h"
#include "log.h"
#include "train_int.h"
#include "tuning.h"

#define INLINE_NEST 4 /* nested single-core steps on the loop (above) */

static size_t label_bytes(const struct tmodel *tm, uint32_t rows)
{
    return (size_t)rows * (tm->sparse ? sizeof(int32_t) : sizeof(float) * (size_t)tm->label_dim);
}

size_t steps_bytes(const struct tmodel *tm, uint32_t rows, int has_labels, int x_bf16)
{
    return (size_t)rows * (size_t)tm->in_dim * (x_bf16 ? sizeof(uint16_t) : sizeof(float)) +
           (has_labels ? label_bytes(tm, rows) : 0);
}

/* TPUEMU_TEST_STEP_MS (tests only): each training step's compute takes at
 * least this long, so that a test can show that what it checks holds on a
 * slower machine (0..1000; 0 or unset: off). Read first on the loop thread
 * (run_step), before any pool thread reads it. */
static uint64_t test_step_ns(void)
{
    static uint64_t v = UINT64_MAX;
    if (v == UINT64_MAX) {
        v = (uint64_t)tuning_get()->test_step_ms * 1000000u;
    }
    return v;
}

static void pool_step(uv_work_t *req)
{
    struct train *t = req->data;
    struct treq *r = t->cur;
    struct tmodel *tm = t->pool_tm;
    err *e = &r->e;
    uint64_t t0 = uv_hrtime();

    err_clear(e);
    r->t_step0 = t0;
    r->t_opt0 = r->t_opt1 = 0;
    model_set_recorder(tm->m, r->mode == TPUEMU__STEP_MODE__STEP_TRAIN && trace_capacity(t->env.trace) ? r->rec : NULL,
                       sizeof r->rec / sizeof r->rec[0]);
#if defined(__SSE__)
    /* Flush denormals to zero, as the TPU (and TensorFlow's CPU threads) do:
     * Adam's moments of gradients that stay zero decay into denormals, and
     * every operation on one costs a microcode assist (the optimizer took 8x
     * longer). Set on every call: the pool's threads are shared. Every core
     * flushes the same way, so replicas stay identical. */
    _mm_setcsr(_mm_getcsr() | 0x8040);
#endif
    if (tm->pending) {
        tm_flush_update(tm);
        r->t_opt0 = t0;
        r->t_opt1 = uv_hrtime();
        r->stats[r->i].optimizer_ns = r->t_opt1 - t0;
    }
    do {
        uint32_t i = r->i, rows = r->rows[i];
        const float *x = (const float *)(r->payload + r->off);
        const void *y = r->has_labels ? r->payload + r->off +
                                            (size_t)rows * tm->in_dim * (r->x_bf16 ? sizeof(uint16_t) : sizeof(float))
                                      : NULL;
        Tpuemu__StepStat *s = &r->stats[i];
        struct model_metrics mt = {0, 0, 0};
        uint64_t c0 = uv_hrtime();
        double mm0 = model_matmul_seconds(tm->m);
        float *out = r->mode == TPUEMU__STEP_MODE__STEP_PREDICT ? (float *)(r->out + r->out_len) : NULL;

        if (r->x_bf16) { /* exact: the first layer's rounding leaves these values as they are */
            bf16_to_f32_n(tm->xw, (const uint16_t *)(const void *)(r->payload + r->off), (size_t)rows * tm->in_dim);
            x = tm->xw;
        }
        model_set_training(tm->m, r->mode == TPUEMU__STEP_MODE__STEP_TRAIN);
        if (r->mode == TPUEMU__STEP_MODE__STEP_TRAIN)
            sync_begin_step(t, r->coll_seq + i * (1 + (uint64_t)model_sync_calls(tm->m)), r->epoch);
        if (model_forward(tm->m, x, (int)rows, out, e) != CODE_OK)
            break;
        if (out)
            r->out_len += (size_t)rows * tm->out_dim * sizeof(float);
        if (r->mode == TPUEMU__STEP_MODE__STEP_TRAIN) {
            if (model_backward(tm->m, y, (int)rows, &mt, e) != CODE_OK)
                break;
        } else if (r->has_labels && model_metrics_of(tm->m, y, (int)rows, &mt, e) != CODE_OK) {
            break;
        }
        s->loss_sum = mt.loss_sum;
        s->correct = mt.correct;
        s->rows = rows;
        s->step = r->first_step + i;
        int pct = atomic_load_explicit(&t->throttle_pct, memory_order_relaxed);
        if (pct < 100) { /* a slower chip: the step takes 100/pct as long */
            uint64_t spent = uv_hrtime() - c0, extra = spent * (uint64_t)(100 - pct) / (uint64_t)pct;
            struct timespec ts = {(time_t)(extra / 1000000000u), (long)(extra % 1000000000u)};
            nanosleep(&ts, NULL);
        }
        uint64_t least = r->mode == TPUEMU__STEP_MODE__STEP_TRAIN ? test_step_ns() : 0, spent = uv_hrtime() - c0;
        if (spent < least) {
            struct timespec ts = {(time_t)((least - spent) / 1000000000u), (long)((least - spent) % 1000000000u)};
            nanosleep(&ts, NULL);
        }
        r->st0[i] = c0;
        r->st1[i] = uv_hrtime();
        s->compute_ns = r->st1[i] - c0;
        s->matmul_ns = (uint64_t)((model_matmul_seconds(tm->m) - mm0) * 1e9);
        r->off += steps_bytes(tm, rows, r->has_labels, r->x_bf16);
        if (r->mode == TPUEMU__STEP_MODE__STEP_TRAIN)
            break; /* the all-reduce follows on the loop */
        r->i++;
    } while (r->i < r->steps);
}

static void on_allreduce(void *arg, const err *e, const uint8_t *out, size_t out_len);
static void after_step(uv_work_t *req, int status);

static uint64_t inline_max_ns(void)
{
    static uint64_t v = UINT64_MAX;
    if (v == UINT64_MAX) {
        v = (uint64_t)tuning_get()->train_inline_max_us * 1000u;
    }
    return v;
}

/* Is r's next step small enough to run on the loop thread? */
static int step_inline(const struct train *t, const struct treq *r)
{
    uint64_t last = r->i > 0 ? r->stats[r->i - 1].compute_ns : t->last_compute_ns;
    return last && last < inline_max_ns() && atomic_load_explicit(&t->throttle_pct, memory_order_relaxed) >= 100 &&
           !test_step_ns() && (t->env.id->num_replicas >= 2 || t->inline_depth < INLINE_NEST) &&
           r->mode == TPUEMU__STEP_MODE__STEP_TRAIN &&
           !(t->tm && model_sync_calls(t->tm->m)); /* a synchronized step waits for the loop */
}

/* Runs the next step: on the loop thread when it is small, else on the pool. */
static void run_step(struct train *t, struct treq *r)
{
    t->busy = 1;
    t->pool_tm = t->tm;
    if (step_inline(t, r)) {
#if defined(__SSE__)
        unsigned csr = _mm_getcsr(); /* pool_step flushes denormals: only for the step */
#endif
        pool_step(&t->work);
#if defined(__SSE__)
        _mm_setcsr(csr);
#endif
        t->inline_depth++;
        after_step(&t->work, 0);
        t->inline_depth--;
        return;
    }
    uv_queue_work(t->env.loop, &t->work, pool_step, after_step);
}

/* What the pool recorded of the step(s) it ran, into the ring. */
static void trace_pool(struct train *t, struct treq *r)
{
    trace *tr = t->env.trace;
    struct trace_ev ev;
    uint64_t step = r->first_step + r->i;
    size_t n = t->tm ? model_recorded(t->tm->m) : 0;

    if (!trace_capacity(tr))
        return;
    if (r->mode != TPUEMU__STEP_MODE__STEP_TRAIN) {
        for (uint32_t i = 0; i < r->steps; i++)
            trace_span(tr, TPUEMU__TRACE_KIND__TRACE_EVAL, r->st0[i], r->st1[i], r->first_step + i);
        return;
    }
    if (r->t_opt1)
        trace_span(tr, TPUEMU__TRACE_KIND__TRACE_OPTIMIZER, r->t_opt0, r->t_opt1, step);
    for (size_t i = 0; i < n; i++) {
        const struct model_rec *m = &r->rec[i];
        memset(&ev, 0, sizeof ev);
        ev.kind = m->kind == MODEL_REC_FORWARD    ? TPUEMU__TRACE_KIND__TRACE_FORWARD
                  : m->kind == MODEL_REC_BACKWARD ? TPUEMU__TRACE_KIND__TRACE_BACKWARD
                                                  : TPUEMU__TRACE_KIND__TRACE_MATMUL;
        ev.t0 = m->t0;
        ev.dur = m->t1 - m->t0;
        ev.step = step;
        ev.layer = (uint32_t)m->layer;
        ev.op = (uint32_t)m->op;
        ev.m = (uint64_t)m->m;
        ev.n = (uint64_t)m->n;
        ev.k = (uint64_t)m->k;
        ev.bytes = m->bytes;
        trace_add(tr, &ev);
    }
}

static void after_step(uv_work_t *req, int status)
{
    struct train *t = req->data;
    struct treq *r = t->cur;
    (void)status;

    t->busy = 0;
    if (r && r->mode == TPUEMU__STEP_MODE__STEP_TRAIN && r->e.code == CODE_OK)
        t->last_compute_ns = r->stats[r->i].compute_ns;
    if (t->orphan) { /* the system was reset while the pool ran */
        tm_free(t->orphan);
        t->orphan = NULL;
        treq_answerf(t, r, CODE_ABORTED, "the TPU system was re-initialized (epoch %" PRIu64 ") during step %" PRIu64,
                t->env.id->epoch, r->first_step + r->i);
        t->next(t);
        return;
    }
    if (r->e.code == CODE_OK)
        trace_pool(t, r);
    if (r->e.code != CODE_OK) {
        err e = r->e;
        err_prefix(&e, "step %" PRIu64 " on core %s/%d", r->first_step + r->i, t->env.id->host_id, t->env.id->core);
        log_warn("step failed", "step=%" PRIu64 " code=%s reason=%s", r->first_step + r->i, code_name(e.code),
                 log_q(e.msg));
        treq_abort_rest(t, r, r->i, &e);
        treq_answer(t, r, &e);
        t->next(t);
        return;
    }
    if (r->mode != TPUEMU__STEP_MODE__STEP_TRAIN) {
        treq_answer(t, r, &r->e);
        t->next(t);
        return;
    }
    r->t_ar = uv_hrtime();
    if (t->env.id->num_replicas < 2) {
        err ok;
        err_clear(&ok);
        on_allreduce(r, &ok, NULL, 0);
        return;
    }
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__CollSpec cs = TPUEMU__COLL_SPEC__INIT;
    cs.kind = TPUEMU__COLL_KIND__COLL_ALL_REDUCE;
    cs.op = TPUEMU__REDUCE_OP__REDUCE_SUM;
    cs.dtype = TPUEMU__DTYPE__DTYPE_F32;
    cs.count = model_num_params(t->tm->m);
    h.kind = KIND(COLL);
    h.epoch = r->epoch;
    h.seq = r->coll_seq + r->i * (1 + (uint64_t)model_sync_calls(t->tm->m)) + (uint64_t)model_sync_calls(t->tm->m);
    h.coll = &cs;
    /* reduced in place: nothing writes the gradients until the answer (or, after
     * a failure, until the reset: tm->failed keeps training off them) */
    coll_submit(t->env.coll, &h, (uint8_t *)model_grads(t->tm->m), cs.count * sizeof(float), on_allreduce, r);
}

static void on_allreduce(void *arg, const err *e, const uint8_t *out, size_t out_len)
{
    struct treq *r = arg;
    struct train *t = r->t;
    struct tmodel *tm = t->tm;

    uint64_t now = uv_hrtime();
    r->stats[r->i].allreduce_ns = now - r->t_ar;
    if (e->code == CODE_OK && tm && trace_capacity(t->env.trace)) {
        struct trace_ev ev;
        memset(&ev, 0, sizeof ev);
        ev.kind = TPUEMU__TRACE_KIND__TRACE_ALLREDUCE;
        ev.t0 = r->t_ar;
        ev.dur = now - r->t_ar;
        ev.step = r->first_step + r->i;
        ev.seq = r->coll_seq + r->i;
        ev.bytes = model_num_params(tm->m) * sizeof(float);
        ev.peer = (int32_t)t->env.id->num_replicas;
        trace_add(t->env.trace, &ev);
        trace_span(t->env.trace, TPUEMU__TRACE_KIND__TRACE_STEP, r->t_step0, now, r->first_step + r->i);
    }
    if (e->code != CODE_OK || !tm) {
        err f = *e;
        if (f.code == CODE_OK)
            err_set(&f, CODE_ABORTED, "the model was dropped (the TPU system was re-initialized)");
        err_prefix(&f, "step %" PRIu64 " (gradient all-reduce)", r->first_step + r->i);
        if (tm && !tm->failed) {
            tm->failed = 1;
            tm->fail_err = f;
        }
        treq_abort_rest(t, r, r->i + 1, &f);
        treq_answer(t, r, &f);
        t->next(t);
        return;
    }
    if (out && (const float *)out != model_grads(tm->m) && out_len == model_num_params(tm->m) * sizeof(float))
        memcpy(model_grads(tm->m), out, out_len);
    prom_add(&t->env.stats->steps, 1);
    prom_hist_observe_ns(&t->env.stats->step_seconds, now - r->t_step0);
    t->env.stats->last_step = r->first_step + r->i;
    t->env.stats->last_step_ns = now - r->t_step0;
    t->env.stats->last_allreduce_ns = r->stats[r->i].allreduce_ns;
    tm->pending = 1;
    tm->pending_scale = 1.0f / (float)r->global_rows[r->i];
    if (t->env.on_step)
        t->env.on_step(t->env.on_step_arg, r->first_step + r->i);
    if (++r->i < r->steps) {
        run_step(t, r);
        return;
    }
    treq_answer(t, r, e);
    t->next(t);
}

/* ---- host-side input ---- */

int steps_host_input(const struct tmodel *tm, const Tpuemu__StepsSpec *s, struct hin_spec **out, err *e)
{
    const Tpuemu__HostInput *hi = s->host_input;
    struct hin_spec *hs;
    *out = NULL;
    if (hi->n_batches != s->steps)
        return err_set(e, CODE_INVALID_ARGUMENT, "host input: %zu batch positions for %u steps", hi->n_batches,
                       s->steps);
    if (hi->num_input_pipelines == 0 || hi->input_pipeline_id >= hi->num_input_pipelines)
        return err_set(e, CODE_INVALID_ARGUMENT, "host input: input pipeline %u of %u does not exist",
                       hi->input_pipeline_id, hi->num_input_pipelines);
    if (!hi->images || !hi->labels || strlen(hi->images) >= HIN_PATH_MAX || strlen(hi->labels) >= HIN_PATH_MAX)
        return err_set(e, CODE_INVALID_ARGUMENT, "host input: a file name is missing or longer than %d bytes",
                       HIN_PATH_MAX - 1);
    if (hi->n_ops > HIN_MAX_OPS)
        return err_set(e, CODE_INVALID_ARGUMENT, "host input: %zu ops; at most %d", hi->n_ops, HIN_MAX_OPS);
    if (!(hs = calloc(1, sizeof *hs)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for a host input spec");
    snprintf(hs->images, sizeof hs->images, "%s", hi->images);
    snprintf(hs->labels, sizeof hs->labels, "%s", hi->labels);
    hs->rows = hi->rows;
    hs->x_dim = hi->x_dim;
    hs->nops = hi->n_ops;
    for (size_t i = 0; i < hi->n_ops; i++) {
        const Tpuemu__InputOp *o = hi->ops[i];
        hs->ops[i].kind = (int)o->kind;
        hs->ops[i].a = o->a;
        hs->ops[i].b = o->b;
        hs->ops[i].buffer = o->buffer;
        hs->ops[i].seed = o->seed;
        hs->ops[i].batch = o->batch;
        hs->ops[i].depth = o->depth;
    }
    *out = hs;
    if (hin_spec_check(hs, e) != CODE_OK)
        return e->code;
    if (!s->has_labels && s->mode != TPUEMU__STEP_MODE__STEP_PREDICT)
        return err_set(e, CODE_INVALID_ARGUMENT, "host input: steps that need labels without them");
    for (uint32_t i = 0; i < s->steps; i++)
        if (s->rows[i] != hin_batch_size(hs))
            return err_set(e, CODE_INVALID_ARGUMENT, "host input: step %u has %u rows; the pipeline's batch is %u", i,
                           s->rows[i], (unsigned)hin_batch_size(hs));
    if (tm && (!tm->sparse || (uint32_t)tm->in_dim != hs->x_dim))
        return err_set(e, CODE_INVALID_ARGUMENT,
                       "host input: the model takes %d values per row%s; the files give %u "
                       "and int32 class ids",
                       tm->in_dim, tm->sparse ? "" : " and dense labels", (unsigned)hs->x_dim);
    return CODE_OK;
}

/* On the pool: the pipeline (opened on first use: it reads the files) fills
 * each step's infeed. */
static void pool_fill(uv_work_t *req)
{
    struct train *t = req->data;
    struct treq *r = t->cur;
    struct tmodel *tm = t->pool_tm;
    err *e = &r->e;
    uint32_t bs = hin_batch_size(r->hin);
    int32_t *ytmp = NULL;

    err_clear(e);
    /* the request's pipeline, moved to the front; a new one opens in the
     * place of the least recently used */
    int slot = 0;
    while (slot < TRAIN_MAX_PIPES && !hin_is(t->pipes[slot], r->hin, r->hin_id, r->hin_num))
        slot++;
    if (slot == TRAIN_MAX_PIPES) {
        slot = TRAIN_MAX_PIPES - 1;
        uint64_t t0 = uv_hrtime();
        hin_close(t->pipes[slot]);
        t->pipes[slot] = NULL;
        if (hin_open(r->hin, r->hin_id, r->hin_num, &t->pipes[slot], e) != CODE_OK)
            goto fail;
        r->hin_open_ns = uv_hrtime() - t0 + 1;
    }
    struct hin_pipe *pipe = t->pipes[slot];
    memmove(&t->pipes[1], &t->pipes[0], (size_t)slot * sizeof t->pipes[0]);
    t->pipes[0] = pipe;
    if (!r->has_labels && !(ytmp = malloc((size_t)bs * sizeof *ytmp))) {
        err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    size_t off = 0;
    for (uint32_t i = 0; i < r->steps; i++) {
        float *x = (float *)(r->payload + off);
        int32_t *y = r->has_labels ? (int32_t *)(r->payload + off + (size_t)bs * tm->in_dim * sizeof(float)) : ytmp;
        if (hin_fill(pipe, r->hin_epoch, r->hin_batch[i], x, y, e) != CODE_OK)
            goto fail;
        for (uint32_t k = 0; r->has_labels && k < bs; k++)
            if (y[k] < 0 || y[k] >= tm->out_dim) {
                err_set(e, CODE_INVALID_ARGUMENT,
                        "%s: label %d in row %u of batch %" PRIu64 " (epoch %" PRIu64
                        ") is outside 0..%d (the last layer has %d units)",
                        r->hin->labels, (int)y[k], k, r->hin_batch[i], r->hin_epoch, tm->out_dim - 1, tm->out_dim);
                goto fail;
            }
        off += steps_bytes(tm, bs, r->has_labels, 0);
    }
    free(ytmp);
    return;
fail:
    free(ytmp);
    err_prefix(e, "host-side input pipeline %u of %u", (unsigned)r->hin_id, (unsigned)r->hin_num);
}

static void after_fill(uv_work_t *req, int status)
{
    struct train *t = req->data;
    struct treq *r = t->cur;
    (void)status;

    t->busy = 0;
    if (t->orphan) {
        tm_free(t->orphan);
        t->orphan = NULL;
        treq_answerf(t, r, CODE_ABORTED, "the TPU system was re-initialized (epoch %" PRIu64 ") during step %" PRIu64,
                     t->env.id->epoch, r->first_step);
        t->next(t);
        return;
    }
    if (r->e.code != CODE_OK) {
        err e = r->e;
        err_prefix(&e, "core %s/%d", t->env.id->host_id, t->env.id->core);
        log_warn("host input failed", "code=%s reason=%s", code_name(e.code), log_q(e.msg));
        treq_abort_rest(t, r, 0, &e);
        treq_answer(t, r, &e);
        t->next(t);
        return;
    }
    if (r->hin_open_ns)
        log_info("host input pipeline opened", "pipeline=%u of=%u images=%s labels=%s rows=%" PRIu64 " ms=%.1f",
                 (unsigned)r->hin_id, (unsigned)r->hin_num, log_q(r->hin->images), log_q(r->hin->labels), r->hin->rows,
                 (double)r->hin_open_ns / 1e6);
    run_step(t, r);
}

void steps_start(struct train *t, struct treq *r)
{
    struct tmodel *tm = t->tm;
    if (r->mode == TPUEMU__STEP_MODE__STEP_PREDICT) {
        size_t total = 0;
        for (uint32_t i = 0; i < r->steps; i++)
            total += r->rows[i];
        r->out_len = 0;
        if (!(r->out = malloc(total * (size_t)tm->out_dim * sizeof(float) + 1))) {
            treq_answerf(t, r, CODE_RESOURCE_EXHAUSTED, "out of memory for %zu predictions", total);
            t->next(t);
            return;
        }
    }
    r->i = 0;
    r->off = 0;
    if (r->hin) {
        size_t total = 0;
        for (uint32_t i = 0; i < r->steps; i++)
            total += steps_bytes(tm, r->rows[i], r->has_labels, 0);
        free(r->payload);
        if (!(r->payload = malloc(total + 1))) {
            err e;
            err_set(&e, CODE_RESOURCE_EXHAUSTED, "out of memory for %zu bytes of host-side infeed", total);
            treq_abort_rest(t, r, 0, &e);
            treq_answer(t, r, &e);
            t->next(t);
            return;
        }
        t->busy = 1;
        t->pool_tm = tm;
        /* when an open pipeline's prefetch thread has every batch of the
         * request ready, copying them in on the loop costs less than the two
         * thread wake-ups of a trip through the pool, for a small step; what
         * could block (opening a pipeline reads the files, a batch not ready
         * is waited for or gathered) stays on the pool, off the loop */
        struct hin_pipe *open = NULL;
        for (int k = 0; k < TRAIN_MAX_PIPES && !open; k++)
            if (hin_is(t->pipes[k], r->hin, r->hin_id, r->hin_num))
                open = t->pipes[k];
        int ready = open && step_inline(t, r);
        for (uint32_t i = 0; ready && i < r->steps; i++)
            ready = hin_ready(open, r->hin_epoch, r->hin_batch[i]);
        if (ready) {
            pool_fill(&t->work);
            after_fill(&t->work, 0);
            return;
        }
        uv_queue_work(t->env.loop, &t->work, pool_fill, after_fill);
        return;
    }
    run_step(t, r);
}

/* ---- state ---- */

void steps_state_get(struct train *t, struct treq *r)
{
    struct tmodel *tm = t->tm;
    size_t np = model_num_params(tm->m);
    int ns = model_opt_num_slots(tm->m);
    tm_flush_update(tm);
    if (!(r->out = malloc(np * sizeof(float) * (size_t)(1 + ns) + 1))) {
        treq_answerf(t, r, CODE_RESOURCE_EXHAUSTED, "out of memory for the model state");
        return;
    }
    memcpy(r->out, model_params(tm->m), np * sizeof(float));
    for (int s = 0; s < ns; s++)
        memcpy(r->out + np * sizeof(float) * (size_t)(1 + s), model_opt_slot(tm->m, s), np * sizeof(float));
    r->out_len = np * sizeof(float) * (size_t)(1 + ns);
    r->state.model_id = tm->id;
    r->state.num_params = np;
    r->state.num_slots = (uint32_t)ns;
    r->state.iterations = model_opt_iterations(tm->m);
    r->has_state = 1;
    err ok;
    err_clear(&ok);
    treq_answer(t, r, &ok);
}

void steps_state_set(struct train *t, struct treq *r)
{
    struct tmodel *tm = t->tm;
    size_t np = model_num_params(tm->m);
    int ns = model_opt_num_slots(tm->m);
    /* sizes were checked on arrival (train_check_payload) */
    tm->pending = 0;
    memcpy(model_params(tm->m), r->payload, np * sizeof(float));
    for (int s = 0; s < ns; s++)
        memcpy(model_opt_slot(tm->m, s), r->payload + np * sizeof(float) * (size_t)(1 + s), np * sizeof(float));
    model_set_opt_iterations(tm->m, r->state.iterations);
    err ok;
    err_clear(&ok);
    treq_answer(t, r, &ok);
}

