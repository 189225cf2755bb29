/* Training requests on the data connections (train_io.h): per replica a FIFO
 * of answers expected, the frames themselves queued on dpio's connections,
 * and dpio's loop over every connection that writes and reads at the same
 * time, so a core's answer is read while the next requests' infeed is still
 * going out. This file only says what an answer looks like and whose it is. */
#include "train_io.h"

#include "call.h"
#include "hostin.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KIND(k) TPUEMU__FRAME_KIND__FRAME_##k
#define TIO_MAX_PEND 64

/* Plain memory (cli_coll_free frees it as such). */
struct tio_stream {
    struct tio_ans *pend[TIO_MAX_PEND];
    uint64_t pend_seq[TIO_MAX_PEND];
    size_t ph, pn;       /* FIFO head and count */
    struct tio_ans *cur; /* whose payload is being read */
    unsigned failures;   /* answers that said a request failed, of any step in flight */
};

struct wait_ctx {
    struct cli_coll *k;
    struct tio_ans *const *ans;
    size_t n; /* replicas 0..n waited for */
};

static struct tio_stream *streams(tpu_cluster *c)
{
    struct cli_coll *k = c->coll;
    if (!k->tio)
        k->tio = calloc(k->n, sizeof *k->tio);
    return k->tio;
}

static void ans_fail(struct tio_ans *a, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void ans_fail(struct tio_ans *a, int code, const char *fmt, ...)
{
    va_list ap;
    if (a->done)
        return;
    a->done = 1;
    a->code = code;
    va_start(ap, fmt);
    vsnprintf(a->msg, sizeof a->msg, fmt, ap);
    va_end(ap);
}

/* Every answer still expected on s fails. */
static void stream_fail(struct tio_stream *s, int code, const char *msg)
{
    for (size_t i = 0; i < s->pn; i++)
        ans_fail(s->pend[(s->ph + i) % TIO_MAX_PEND], code, "%s", msg);
    memset(s, 0, sizeof *s);
}

/* Queues the frame h (kind, model/steps/state set by the caller; epoch set
 * here) with its payload on replica r's connection (tio_post_req). */
static int tio_post(tpu_cluster *c, size_t r, Tpuemu__FrameHeader *h, const struct dpio_seg *segs, size_t nseg,
                    struct tio_ans *ans, err *e)
{
    struct cli_coll *k = c->coll;
    struct tio_stream *s = streams(c);
    struct dpio_conn *p = &k->peers[r];
    int rc;

    if (!s)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    s += r;
    memset(ans, 0, offsetof(struct tio_ans, dst));
    ans->nstats = 0;
    ans->got = 0;
    ans->cores = 0;
    ans->notice_replica = -1;
    if (nseg > TIO_MAX_SEGS || s->pn >= TIO_MAX_PEND)
        return err_set(e, CODE_INTERNAL, "too many requests in flight to core %s/%d", p->host, p->core);
    /* failures counts the failed answers of requests in flight; with none in
     * flight, every earlier answer has been read and waited for. A failure
     * kept past that (a compile refused for want of HBM, then one that fits)
     * would cut every later wait to the grace: a step slower than it would
     * fail "after another core failed" when none had. */
    if (!s->pn)
        s->failures = 0;
    if (p->fd < 0) {
        if (s->pn) /* answers still expected on a connection that is gone */
            return err_set(e, CODE_UNAVAILABLE, "core %s/%d lost its data connection", p->host, p->core);
        if (dpio_connect(k->peers, k->n, &c->r->auth, c->r->sender, wire_now_ms() + DPIO_CONNECT_MS, e) != CODE_OK)
            return e->code;
    }
    h->epoch = k->epoch;
    if ((rc = dpio_send(p, h, segs, nseg)) != CODE_OK)
        return err_set(e, rc,
                       rc == CODE_INVALID_ARGUMENT ? "the request does not fit in a frame header" : "out of memory");
    s->pend[(s->ph + s->pn) % TIO_MAX_PEND] = ans;
    s->pend_seq[(s->ph + s->pn) % TIO_MAX_PEND] = h->seq;
    s->pn++;
    return CODE_OK;
}

int tio_post_req(tpu_cluster *c, size_t r, const struct tio_req *q, const struct dpio_seg *segs, size_t nseg,
                 struct tio_ans *ans, err *e)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__StateInfo si = TPUEMU__STATE_INFO__INIT;
    Tpuemu__ModelSpec ms = TPUEMU__MODEL_SPEC__INIT;
    Tpuemu__OptimizerSpec os = TPUEMU__OPTIMIZER_SPEC__INIT;
    Tpuemu__LayerSpec *ls = NULL, **lp = NULL;
    uint32_t(*tshape)[TIO_MAX_RANK] = NULL;
    uint32_t ishape[TIO_MAX_RANK];
    uint64_t bounds[TPU_LR_MAX_BOUNDARIES];
    float values[TPU_LR_MAX_BOUNDARIES + 1];
    int rc;

    h.seq = q->seq;
    if (q->kind == TIO_STATE_GET || q->kind == TIO_STATE_SET) {
        h.kind = q->kind == TIO_STATE_GET ? KIND(STATE_GET) : KIND(STATE_SET);
        si.model_id = q->model_id;
        if (q->kind == TIO_STATE_SET) {
            si.num_params = q->num_params;
            si.num_slots = q->num_slots;
            si.iterations = q->iterations;
        }
        h.state = &si;
        return tio_post(c, r, &h, segs, nseg, ans, e);
    }
    if (q->kind != TIO_COMPILE || !q->model)
        return err_set(e, CODE_INTERNAL, "a training request of kind %d", (int)q->kind);
    const struct tio_model *m = q->model;
    size_t nl = m->nlayers;
    if (!(ls = calloc(nl ? nl : 1, sizeof *ls)) || !(lp = calloc(nl ? nl : 1, sizeof *lp)) ||
        !(tshape = calloc(nl ? nl : 1, sizeof *tshape))) {
        free(ls);
        free(lp);
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t l = 0; l < nl; l++) {
        const struct tio_layer *y = &m->layers[l];
        tpuemu__layer_spec__init(&ls[l]);
        ls[l].units = y->units;
        ls[l].activation = (Tpuemu__Activation)y->activation;
        ls[l].kind = (Tpuemu__LayerKind)y->kind;
        ls[l].kernel_h = y->kernel_h;
        ls[l].kernel_w = y->kernel_w;
        ls[l].stride_h = y->stride_h;
        ls[l].stride_w = y->stride_w;
        ls[l].padding_same = y->padding_same != 0;
        ls[l].rate = y->rate;
        ls[l].input_dim = y->input_dim;
        ls[l].positions = y->positions != 0;
        ls[l].num_heads = y->num_heads;
        ls[l].key_dim = y->key_dim;
        ls[l].value_dim = y->value_dim;
        ls[l].add_from = y->add_from;
        ls[l].epsilon = y->epsilon;
        ls[l].momentum = y->momentum;
        ls[l].synchronized = y->synchronized != 0;
        ls[l].n_target_shape = y->target_rank < TIO_MAX_RANK ? y->target_rank : TIO_MAX_RANK;
        memcpy(tshape[l], y->target_shape, ls[l].n_target_shape * sizeof **tshape);
        ls[l].target_shape = tshape[l];
        lp[l] = &ls[l];
    }
    ms.n_input_shape = m->input_rank < TIO_MAX_RANK ? m->input_rank : TIO_MAX_RANK;
    memcpy(ishape, m->input_shape, ms.n_input_shape * sizeof *ishape);
    ms.input_shape = ishape;
    const tpu_optimizer *o = m->optimizer;
    os.kind = (uint32_t)o->kind;
    os.learning_rate = o->learning_rate;
    os.momentum = o->momentum;
    os.nesterov = o->nesterov != 0;
    os.beta_1 = o->beta_1;
    os.beta_2 = o->beta_2;
    os.epsilon = o->epsilon;
    const tpu_lr_schedule *sc = &o->schedule;
    os.schedule = (uint32_t)sc->kind;
    os.initial_learning_rate = sc->initial_learning_rate;
    os.decay_steps = sc->decay_steps;
    os.decay_rate = sc->decay_rate;
    os.staircase = sc->staircase != 0;
    os.alpha = sc->alpha;
    os.has_warmup_target = sc->has_warmup_target != 0;
    os.warmup_target = sc->warmup_target;
    os.warmup_steps = sc->warmup_steps;
    if (sc->kind == TPU_LR_PIECEWISE_CONSTANT_DECAY) {
        os.n_boundaries = sc->num_boundaries;
        os.boundaries = bounds;
        memcpy(bounds, sc->boundaries, sc->num_boundaries * sizeof *bounds);
        os.n_values = sc->num_boundaries + 1;
        os.values = values;
        memcpy(values, sc->values, os.n_values * sizeof *values);
    }
    ms.model_id = m->model_id;
    ms.input_dim = m->input_dim;
    ms.n_layers = nl;
    ms.layers = lp;
    ms.loss = (Tpuemu__Loss)m->loss;
    ms.optimizer = &os;
    ms.mixed_bfloat16 = m->mixed_bfloat16 != 0;
    ms.seed = m->seed;
    ms.batch_per_core = m->batch_per_core;
    ms.infeed_depth = m->infeed_depth;
    ms.steps_per_execution = m->steps_per_execution;
    ms.deterministic = m->deterministic != 0;
    ms.gradient_checkpointing = m->gradient_checkpointing != 0;
    ms.from_logits = m->from_logits != 0;
    ms.label_dim = m->label_dim;
    h.kind = KIND(COMPILE);
    h.model = &ms;
    rc = tio_post(c, r, &h, segs, nseg, ans, e);
    free(ls);
    free(lp);
    free(tshape);
    return rc;
}

void tio_steps_begin(tpu_cluster *c, struct tio_steps *s)
{
    struct cli_coll *k = c->coll;
    s->seq = k->next_seq++;
    s->coll_seq = 0;
    if (s->mode == TPU_STEP_TRAIN) {
        s->coll_seq = k->next_seq;
        k->next_seq += (uint64_t)s->steps * (1 + s->colls_per_step);
    }
}

int tio_post_steps(tpu_cluster *c, size_t r, const struct tio_steps *s, const struct dpio_seg *segs, size_t nseg,
                   struct tio_ans *ans, err *e)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__StepsSpec ss = TPUEMU__STEPS_SPEC__INIT;

    h.kind = TPUEMU__FRAME_KIND__FRAME_STEPS;
    h.seq = s->seq;
    ss.model_id = s->model_id;
    ss.mode = s->mode == TPU_STEP_TRAIN      ? TPUEMU__STEP_MODE__STEP_TRAIN
              : s->mode == TPU_STEP_EVALUATE ? TPUEMU__STEP_MODE__STEP_EVALUATE
                                             : TPUEMU__STEP_MODE__STEP_PREDICT;
    ss.steps = s->steps;
    ss.n_rows = ss.n_global_rows = s->steps;
    ss.rows = (uint32_t *)(uintptr_t)s->rows;
    ss.global_rows = (uint32_t *)(uintptr_t)s->global_rows;
    ss.has_labels = s->mode != TPU_STEP_PREDICT;
    ss.first_step = s->first_step;
    ss.coll_seq = s->coll_seq;
    ss.client_input_start_ns = s->client_input_start_ns;
    ss.client_input_wait_ns = s->client_input_wait_ns;
    ss.client_post_ns = s->client_post_ns;
    ss.client_pid = s->client_pid;
    Tpuemu__HostInput hi = TPUEMU__HOST_INPUT__INIT;
    Tpuemu__InputOp ops[HIN_MAX_OPS], *opp[HIN_MAX_OPS];
    if (s->hin) {
        hi.images = (char *)(uintptr_t)s->hin->images;
        hi.labels = (char *)(uintptr_t)s->hin->labels;
        hi.rows = s->hin->rows;
        hi.x_dim = s->hin->x_dim;
        hi.n_ops = s->hin->nops < HIN_MAX_OPS ? s->hin->nops : HIN_MAX_OPS;
        for (size_t i = 0; i < hi.n_ops; i++) {
            const struct hin_op *o = &s->hin->ops[i];
            tpuemu__input_op__init(&ops[i]);
            ops[i].kind = (uint32_t)o->kind;
            ops[i].a = o->a;
            ops[i].b = o->b;
            ops[i].buffer = o->buffer;
            ops[i].seed = o->seed;
            ops[i].batch = o->batch;
            ops[i].depth = o->depth;
            opp[i] = &ops[i];
        }
        hi.ops = opp;
        hi.input_pipeline_id = s->hin_id;
        hi.num_input_pipelines = s->hin_num;
        hi.epoch = s->hin_epoch;
        hi.n_batches = s->steps;
        hi.batches = (uint64_t *)(uintptr_t)s->hin_batches;
        ss.host_input = &hi;
    }
    ss.x_dtype = s->x_bf16 ? TPUEMU__DTYPE__DTYPE_BF16 : TPUEMU__DTYPE__DTYPE_F32;
    ss.fanout = s->fanout;
    ss.fanout_cores = s->fanout ? s->fanout_cores : 0;
    ss.fanout_wait_ms = s->fanout ? s->fanout_wait_ms : 0;
    h.steps = &ss;
    return tio_post(c, r, &h, segs, nseg, ans, e);
}

void tio_ans_none(struct tio_ans *a)
{
    /* the fields a wait and a failure's report read; the rest is not read
     * (a slot is a few KB, and hundreds of them each execution cost misses) */
    a->done = 1;
    a->code = CODE_OK;
    a->said = 0;
    a->msg[0] = '\0';
}

/* A whole answer header is in: match it to the oldest expected answer. */
static int on_header(void *arg, size_t r, Tpuemu__FrameHeader *h, void **dst)
{
    struct wait_ctx *w = arg;
    struct tio_stream *s = &w->k->tio[r];
    struct dpio_conn *p = &w->k->peers[r];
    struct tio_ans *a = s->pn ? s->pend[s->ph] : NULL;

    s->cur = NULL;
    if (h->kind == KIND(ERROR)) {
        s->failures++;
        dpio_failf(p, CODE_UNAVAILABLE, "refused the request: %.900s",
                   h->status && h->status->message ? h->status->message : "(no reason given)");
        if (a && !a->done) {
            a->said = 1;
            ans_fail(a, h->status && h->status->code ? (int)h->status->code : CODE_UNKNOWN, "%s",
                     h->status && h->status->message && *h->status->message ? h->status->message
                                                                            : "the core refused the request");
        }
        return DPIO_LOST; /* the core closes the connection after an ERROR */
    }
    if (h->kind != KIND(MODEL_RESULT) || !a || h->seq != s->pend_seq[s->ph]) {
        dpio_failf(p, CODE_UNAVAILABLE, "answered with frame kind %d, seq %llu, which was not expected", (int)h->kind,
                   (unsigned long long)h->seq);
        return DPIO_LOST;
    }
    if (h->status && h->status->code != TPUEMU__CODE__OK) {
        s->failures++;
        a->said = 1;
        a->code = (int)h->status->code;
        snprintf(a->msg, sizeof a->msg, "%s",
                 h->status->message && *h->status->message ? h->status->message : "the request failed");
    } else {
        a->code = CODE_OK;
        a->msg[0] = '\0';
        if (h->payload_bytes > (a->dst ? a->dst_cap : 0)) {
            a->code = CODE_INTERNAL;
            snprintf(a->msg, sizeof a->msg, "core %s/%d answered with %llu payload bytes, at most %zu expected",
                     p->host, p->core, (unsigned long long)h->payload_bytes, a->dst ? a->dst_cap : 0);
        } else {
            *dst = a->dst;
        }
        a->nstats = h->n_step_stats < TIO_MAX_STEPS ? h->n_step_stats : TIO_MAX_STEPS;
        for (size_t i = 0; i < a->nstats; i++) {
            const Tpuemu__StepStat *st = h->step_stats[i];
            struct tio_stat *d = &a->stats[i];
            d->loss_sum = st->loss_sum;
            d->correct = st->correct;
            d->rows = st->rows;
            d->compute_ns = st->compute_ns;
            d->matmul_ns = st->matmul_ns;
            d->allreduce_ns = st->allreduce_ns;
            d->optimizer_ns = st->optimizer_ns;
            d->infeed_wait_ns = st->infeed_wait_ns;
            d->allreduce_min_ns = st->allreduce_min_ns;
        }
        a->cores = h->cores;
        if (h->state) {
            a->num_params = h->state->num_params;
            a->num_slots = h->state->num_slots;
            a->iterations = h->state->iterations;
        }
    }
    a->hbm_used = h->hbm_used;
    a->hbm_capacity = h->hbm_capacity;
    cli_notice_from(h->notice, &a->notice);
    a->notice_replica = h->notice && h->cores ? h->notice_replica : -1;
    s->cur = a;
    s->ph = (s->ph + 1) % TIO_MAX_PEND;
    s->pn--;
    return DPIO_PAYLOAD;
}

static int on_frame(void *arg, size_t r, uint64_t got)
{
    struct tio_stream *s = &((struct wait_ctx *)arg)->k->tio[r];
    if (s->cur) {
        s->cur->got = (size_t)got;
        s->cur->done = 1;
        s->cur = NULL;
    }
    return 0; /* answers keep coming */
}

/* The connection of replica r is done for: every answer still expected fails. */
static void on_lost(void *arg, size_t r, int code, const char *msg)
{
    (void)code;
    stream_fail(&((struct wait_ctx *)arg)->k->tio[r], CODE_UNAVAILABLE, msg);
}

static int state(void *arg)
{
    const struct wait_ctx *w = arg;
    size_t n = w->n, open_n = 0;
    int any_failed = 0;
    for (size_t r = 0; r < n; r++) {
        if (!w->ans[r]->done)
            open_n++;
        else if (w->ans[r]->code != CODE_OK)
            any_failed = 1;
    }
    if (!open_n)
        return DPIO_DONE;
    /* a core that failed a later step in flight (pipelined steps) failed
     * too: the cores that cannot answer this one get the grace, not the
     * whole deadline */
    for (size_t r = 0; r < n && !any_failed; r++)
        any_failed = w->k->tio[r].failures > 0;
    return any_failed ? DPIO_FAILING : DPIO_MORE;
}

static size_t wait_ans(tpu_cluster *c, struct tio_ans *const *ans, size_t n, uint64_t deadline_ms, uint64_t grace_ms,
                       int soft)
{
    static const struct dpio_ops ops = {on_header, on_frame, on_lost, state};
    struct cli_coll *k = c->coll;
    struct wait_ctx w = {k, ans, n < k->n ? n : k->n};
    struct dpio_run run = {&ops, &w, NULL, deadline_ms, grace_ms, 0, &c->cancel};
    size_t failed = 0;
    n = w.n;
    enum dpio_end end = DPIO_END_NOMEM;

    if (streams(c)) {
        for (size_t r = 0; r < n; r++) { /* only where an answer is due: a wait costs those, not all n */
            k->peers[r].reading = k->peers[r].fd >= 0 && (!ans[r]->done || k->tio[r].pn > 0);
            k->peers[r].max_payload = 0;
        }
        end = dpio_run(k->peers, n, &run);
    }
    if (soft && end == DPIO_END_CANCELLED) {
        for (size_t r = 0; r < n; r++)
            k->peers[r].reading = 0;
        return TIO_INTERRUPTED;
    }
    for (size_t r = 0; r < n; r++) {
        struct dpio_conn *p = &k->peers[r];
        p->reading = 0;
        if (end == DPIO_END_NOMEM)
            ans_fail(ans[r], CODE_RESOURCE_EXHAUSTED, "out of memory");
        else if (end == DPIO_END_CANCELLED)
            ans_fail(ans[r], CODE_CANCELLED, "training was cancelled (tpu_cancel) before core %s/%d answered", p->host,
                     p->core);
        else if (end == DPIO_END_IDLE)
            ans_fail(ans[r], CODE_UNAVAILABLE, "core %s/%d has no data connection", p->host, p->core);
        else if (run.grace_used)
            ans_fail(ans[r], CODE_UNAVAILABLE,
                     "core %s/%d did not answer within %llu ms after another core failed (it hangs or is cut off)",
                     p->host, p->core, (unsigned long long)run.grace_used);
        else
            ans_fail(ans[r], CODE_DEADLINE_EXCEEDED, "core %s/%d did not answer in time", p->host, p->core);
        if (ans[r]->code != CODE_OK)
            failed++;
    }
    return failed;
}

size_t tio_wait(tpu_cluster *c, struct tio_ans *const *ans, uint64_t deadline_ms, uint64_t grace_ms)
{
    return wait_ans(c, ans, SIZE_MAX, deadline_ms, grace_ms, 0);
}

size_t tio_wait_soft(tpu_cluster *c, struct tio_ans *const *ans, uint64_t deadline_ms, uint64_t grace_ms)
{
    return wait_ans(c, ans, SIZE_MAX, deadline_ms, grace_ms, 1);
}

size_t tio_wait_first(tpu_cluster *c, struct tio_ans *const *ans, size_t n, uint64_t deadline_ms, uint64_t grace_ms,
                      int soft)
{
    return wait_ans(c, ans, n, deadline_ms, grace_ms, soft);
}

int tio_rank(const struct tio_ans *a)
{
    if (!a || !a->done)
        return -1;
    return err_rank(a->code, a->msg);
}

const struct tio_ans *tio_worst(struct tio_ans *const *ans, size_t n)
{
    const struct tio_ans *best = NULL;
    int best_rank = -1;
    for (size_t r = 0; r < n; r++) {
        int rank = tio_rank(ans[r]);
        if (rank > best_rank)
            best = ans[r], best_rank = rank;
    }
    return best;
}

void tio_abort(tpu_cluster *c)
{
    struct cli_coll *k = c->coll;
    if (!k || !k->tio)
        return;
    for (size_t r = 0; r < k->n; r++) {
        stream_fail(&k->tio[r], CODE_ABORTED, "abandoned");
        dpio_close(&k->peers[r]);
    }
}
