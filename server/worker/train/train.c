/* The training service of one core (train.h): compiled model, HBM charges,
 * the request queue, and the step state machine
 *
 *   loop: pop STEPS -> pool: [pending update] forward + backward
 *   loop: all-reduce gradients (coll_submit) -> next step, or answer.
 *
 * Compile, state reads and writes run on the loop thread: they are short. */
#include "train.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <uv.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "log.h"
#include "model.h"

#define KIND(k) TPUEMU__FRAME_KIND__FRAME_##k
#define TRAIN_MAX_DEPTH 16
#define TRAIN_QUEUE_SLACK 4 /* requests beyond infeed_depth: compile, state, evaluate */
/* per layer: kernel, bias, up to 2 optimizer slots of each, their gradients,
 * activations; then the backward delta and the infeed's x and y */
#define TRAIN_MAX_BLOCKS (MODEL_MAX_LAYERS * 9 + 3)

struct tmodel {
    uint64_t id;
    model *m;
    int in_dim, out_dim, label_dim, sparse, batch, depth, spe, nlayers;
    uint32_t ids[TRAIN_MAX_BLOCKS];
    size_t nids;
    int pending;         /* gradients reduced, update not yet applied */
    int failed;          /* a gradient all-reduce failed: no training until a reset */
    err fail_err;
    float pending_scale;
    Tpuemu__ModelSpec *spec; /* a copy, for recharging after a failed recompile */
};

struct treq {
    struct treq *next;
    struct train *t;
    dp_conn *conn;       /* NULL once the client went away */
    int kind;
    uint64_t seq, epoch, model_id;
    /* STEPS */
    int mode, has_labels;
    uint32_t steps, i;
    uint32_t rows[TRAIN_MAX_STEPS], global_rows[TRAIN_MAX_STEPS];
    uint64_t coll_seq, first_step;
    uint8_t *payload;    /* the infeed, or STATE_SET's state */
    size_t off;          /* payload offset of step i */
    Tpuemu__StepStat stats[TRAIN_MAX_STEPS];
    uint64_t t_ar;       /* all-reduce start */
    /* the profiler's records (trace.h) of the step the pool ran last */
    struct model_rec rec[MODEL_MAX_LAYERS * 4];
    uint64_t t_step0, t_opt0, t_opt1;
    uint64_t st0[TRAIN_MAX_STEPS], st1[TRAIN_MAX_STEPS]; /* evaluate, predict: each step */
    /* answers */
    uint8_t *out;        /* predictions or state */
    size_t out_len;
    Tpuemu__StateInfo state;
    int has_state;
    Tpuemu__ModelSpec *spec; /* COMPILE */
    err e;               /* the pool's verdict */
};

struct train {
    struct train_env env;
    mxu *u;
    struct tmodel *tm;
    struct tmodel *orphan; /* dropped by a reset while the pool had it */
    struct treq *head, *tail;
    unsigned n;
    struct treq *cur;
    int busy;
    uv_work_t work;
    uint64_t idle_since;   /* when the last STEPS finished and nothing was queued */
    /* the training client's clock: ours minus its, the least seen over its
     * requests (their latency is at least 0), and whose it is */
    int64_t client_off;
    uint32_t client_pid;
};

static void kick(struct train *t);

/* Steps of a small model take well under a millisecond, a large batch's tens
 * of milliseconds; a straggler or a loaded machine seconds. */
static const double step_bounds[] = {0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                     0.05,    0.1,    0.25,  0.5,    1,     2.5,   5};

/* ---- models ---- */

static void tmodel_free(struct tmodel *tm)
{
    if (!tm)
        return;
    model_free(tm->m);
    tpuemu__model_spec__free_unpacked(tm->spec, NULL);
    free(tm);
}

static Tpuemu__ModelSpec *spec_copy(const Tpuemu__ModelSpec *s)
{
    size_t n = tpuemu__model_spec__get_packed_size(s);
    uint8_t *buf = malloc(n ? n : 1);
    Tpuemu__ModelSpec *c;
    if (!buf)
        return NULL;
    tpuemu__model_spec__pack(s, buf);
    c = tpuemu__model_spec__unpack(NULL, n, buf);
    free(buf);
    return c;
}

static void release_blocks(struct train *t, struct tmodel *tm)
{
    err ignored;
    for (size_t i = 0; i < tm->nids; i++)
        hbm_release(t->env.hbm, tm->ids[i], &ignored);
    tm->nids = 0;
}

static int charge(struct train *t, struct tmodel *tm, const struct model_cfg *cfg, const Tpuemu__ModelSpec *sp,
                  err *e)
{
    hbm *h = t->env.hbm;
    int64_t b = cfg->max_rows, prev = cfg->in_dim, maxu = 0;
    int nslots = sp->optimizer && sp->optimizer->kind == 1 ? 2 : sp->optimizer && sp->optimizer->momentum > 0 ? 1 : 0;
    const char *optname = sp->optimizer && sp->optimizer->kind == 1 ? "Adam" : "SGD";
    static const char *const slotname[2][2] = {{"momentum", ""}, {"m", "v"}};
    char name[HBM_NAME_MAX], lname[24];
    int rc;

#define ALLOC(kind, dt, rank, ...)                                                                  \
    do {                                                                                            \
        int64_t d_[] = {__VA_ARGS__};                                                               \
        if ((rc = hbm_alloc(h, kind, name, dt, d_, rank, &tm->ids[tm->nids], e)) != CODE_OK)       \
            goto fail;                                                                              \
        tm->nids++;                                                                                 \
    } while (0)

    tm->nids = 0;
    for (int l = 0; l < cfg->nlayers; l++) {
        int64_t u = cfg->units[l];
        if (l == 0)
            snprintf(lname, sizeof lname, "dense");
        else
            snprintf(lname, sizeof lname, "dense_%d", l);
        snprintf(name, sizeof name, "%s/kernel", lname);
        ALLOC(HBM_WEIGHTS, "f32", 2, prev, u);
        snprintf(name, sizeof name, "%s/bias", lname);
        ALLOC(HBM_WEIGHTS, "f32", 1, u);
        for (int s = 0; s < nslots; s++) {
            snprintf(name, sizeof name, "%s/%s/kernel/%s", optname, lname, slotname[nslots == 2][s]);
            ALLOC(HBM_OPTIMIZER, "f32", 2, prev, u);
            snprintf(name, sizeof name, "%s/%s/bias/%s", optname, lname, slotname[nslots == 2][s]);
            ALLOC(HBM_OPTIMIZER, "f32", 1, u);
        }
        snprintf(name, sizeof name, "gradients/%s/kernel", lname);
        ALLOC(HBM_GRADIENTS, "f32", 2, prev, u);
        snprintf(name, sizeof name, "gradients/%s/bias", lname);
        ALLOC(HBM_GRADIENTS, "f32", 1, u);
        snprintf(name, sizeof name, "%s/activations", lname);
        ALLOC(HBM_ACTIVATIONS, cfg->precision == MODEL_MIXED_BF16 ? "bf16" : "f32", 2, b, u);
        if (u > maxu)
            maxu = u;
        prev = u;
    }
    snprintf(name, sizeof name, "backward/delta");
    ALLOC(HBM_ACTIVATIONS, "f32", 2, 2 * b, maxu);
    snprintf(name, sizeof name, "infeed/x");
    ALLOC(HBM_INFEED, "f32", 3, (int64_t)tm->depth * tm->spe, b, cfg->in_dim);
    snprintf(name, sizeof name, "infeed/y");
    if (tm->sparse)
        ALLOC(HBM_INFEED, "s32", 2, (int64_t)tm->depth * tm->spe, b);
    else
        ALLOC(HBM_INFEED, "f32", 3, (int64_t)tm->depth * tm->spe, b, tm->label_dim);
    /* the gradient all-reduce's buffers must fit next to all of it */
    if (t->env.id->num_replicas > 1) {
        Tpuemu__CollSpec cs = TPUEMU__COLL_SPEC__INIT;
        uint32_t id;
        cs.kind = TPUEMU__COLL_KIND__COLL_ALL_REDUCE;
        cs.count = model_num_params(tm->m);
        int64_t d[1] = {(int64_t)coll_plan_bytes(&cs, (int)t->env.id->num_replicas)};
        if ((rc = hbm_alloc(h, HBM_OTHER, "all-reduce of gradients (buffers)", "u8", d, 1, &id, e)) != CODE_OK)
            goto fail;
        hbm_release(h, id, e);
    }
    return CODE_OK;
fail:
    release_blocks(t, tm);
    return rc;
#undef ALLOC
}

static int cfg_from_spec(const Tpuemu__ModelSpec *sp, struct model_cfg *cfg, err *e)
{
    memset(cfg, 0, sizeof *cfg);
    if (sp->n_layers < 1 || sp->n_layers > MODEL_MAX_LAYERS)
        return err_set(e, CODE_INVALID_ARGUMENT, "a model has 1..%d Dense layers, not %zu", MODEL_MAX_LAYERS,
                       sp->n_layers);
    if (!sp->optimizer)
        return err_set(e, CODE_INVALID_ARGUMENT, "the model has no optimizer");
    if (sp->input_dim < 1 || sp->input_dim > MODEL_MAX_UNITS)
        return err_set(e, CODE_INVALID_ARGUMENT, "input_dim %u is outside 1..%d", sp->input_dim, MODEL_MAX_UNITS);
    cfg->in_dim = (int)sp->input_dim;
    cfg->nlayers = (int)sp->n_layers;
    for (size_t l = 0; l < sp->n_layers; l++) {
        if (sp->layers[l]->units < 1 || sp->layers[l]->units > MODEL_MAX_UNITS)
            return err_set(e, CODE_INVALID_ARGUMENT, "layer %zu: units %u is outside 1..%d", l,
                           sp->layers[l]->units, MODEL_MAX_UNITS);
        if ((unsigned)sp->layers[l]->activation > TPUEMU__ACTIVATION__ACTIVATION_SIGMOID)
            return err_set(e, CODE_INVALID_ARGUMENT, "layer %zu: activation %d is unknown", l,
                           (int)sp->layers[l]->activation);
        cfg->units[l] = (int)sp->layers[l]->units;
        cfg->act[l] = (enum model_act)sp->layers[l]->activation;
    }
    if ((unsigned)sp->loss > TPUEMU__LOSS__LOSS_MEAN_SQUARED_ERROR)
        return err_set(e, CODE_INVALID_ARGUMENT, "loss %d is unknown", (int)sp->loss);
    cfg->loss = (enum model_loss)sp->loss;
    if (sp->optimizer->kind > 1)
        return err_set(e, CODE_INVALID_ARGUMENT, "optimizer %u is neither SGD (0) nor Adam (1)", sp->optimizer->kind);
    cfg->opt.kind = sp->optimizer->kind ? OPT_ADAM : OPT_SGD;
    cfg->opt.learning_rate = sp->optimizer->learning_rate;
    cfg->opt.momentum = sp->optimizer->momentum;
    cfg->opt.nesterov = sp->optimizer->nesterov;
    cfg->opt.beta_1 = sp->optimizer->beta_1;
    cfg->opt.beta_2 = sp->optimizer->beta_2;
    cfg->opt.epsilon = sp->optimizer->epsilon;
    cfg->precision = sp->mixed_bfloat16 ? MODEL_MIXED_BF16 : MODEL_FLOAT32;
    cfg->seed = sp->seed;
    if (sp->batch_per_core < 1 || sp->batch_per_core > (1u << 20))
        return err_set(e, CODE_INVALID_ARGUMENT, "batch_per_core %u is outside 1..%u", sp->batch_per_core, 1u << 20);
    cfg->max_rows = (int)sp->batch_per_core;
    if (sp->infeed_depth < 1 || sp->infeed_depth > TRAIN_MAX_DEPTH)
        return err_set(e, CODE_INVALID_ARGUMENT, "infeed_depth %u is outside 1..%d", sp->infeed_depth,
                       TRAIN_MAX_DEPTH);
    if (sp->steps_per_execution < 1 || sp->steps_per_execution > TRAIN_MAX_STEPS)
        return err_set(e, CODE_INVALID_ARGUMENT, "steps_per_execution %u is outside 1..%d",
                       sp->steps_per_execution, TRAIN_MAX_STEPS);
    if (sp->loss != TPUEMU__LOSS__LOSS_SPARSE_CATEGORICAL_CROSSENTROPY &&
        sp->label_dim != sp->layers[sp->n_layers - 1]->units)
        return err_set(e, CODE_INVALID_ARGUMENT, "label_dim %u differs from the last layer's %u units",
                       sp->label_dim, sp->layers[sp->n_layers - 1]->units);
    return CODE_OK;
}

/* Same layers, input and optimizer: a recompile keeps the variables. */
static int same_shape(const struct model_cfg *a, const struct model_cfg *b)
{
    if (a->in_dim != b->in_dim || a->nlayers != b->nlayers || a->opt.kind != b->opt.kind ||
        (a->opt.momentum > 0) != (b->opt.momentum > 0))
        return 0;
    for (int l = 0; l < a->nlayers; l++)
        if (a->units[l] != b->units[l])
            return 0;
    return 1;
}

static void flush_update(struct tmodel *tm)
{
    if (tm && tm->pending) {
        model_apply_gradients(tm->m, tm->pending_scale);
        tm->pending = 0;
    }
}

static int do_compile(struct train *t, struct treq *r, err *e)
{
    const Tpuemu__ModelSpec *sp = r->spec;
    struct model_cfg cfg;
    struct tmodel *tm, *old = t->tm;
    int rc;

    if ((rc = cfg_from_spec(sp, &cfg, e)) != CODE_OK)
        return rc;
    if (!(tm = calloc(1, sizeof *tm)) || !(tm->spec = spec_copy(sp))) {
        free(tm);
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for the model");
    }
    tm->id = sp->model_id;
    tm->in_dim = cfg.in_dim;
    tm->nlayers = cfg.nlayers;
    tm->out_dim = cfg.units[cfg.nlayers - 1];
    tm->sparse = cfg.loss == LOSS_SPARSE_CCE;
    tm->label_dim = tm->sparse ? 1 : (int)sp->label_dim;
    tm->batch = cfg.max_rows;
    tm->depth = (int)sp->infeed_depth;
    tm->spe = (int)sp->steps_per_execution;
    if ((rc = model_new(&tm->m, &cfg, t->u, e)) != CODE_OK) {
        tmodel_free(tm);
        return rc;
    }
    if (old)
        release_blocks(t, old);
    if ((rc = charge(t, tm, &cfg, sp, e)) != CODE_OK) {
        err ignored;
        err_prefix(e, "core %s/%d (per-core batch %d)", t->env.id->host_id, t->env.id->core, tm->batch);
        if (old && charge(t, old, model_config(old->m), old->spec, &ignored) != CODE_OK)
            log_warn("previous model lost its HBM charge", "reason=%s", log_q(ignored.msg));
        tmodel_free(tm);
        return rc;
    }
    if (old && old->id == tm->id && same_shape(model_config(old->m), &cfg)) {
        /* the same model at a new batch size: its variables carry over */
        size_t np = model_num_params(old->m);
        flush_update(old);
        memcpy(model_params(tm->m), model_params(old->m), np * sizeof(float));
        for (int s = 0; s < model_opt_num_slots(old->m) && s < model_opt_num_slots(tm->m); s++)
            memcpy(model_opt_slot(tm->m, s), model_opt_slot(old->m, s), np * sizeof(float));
        model_set_opt_iterations(tm->m, model_opt_iterations(old->m));
    }
    tmodel_free(old);
    t->tm = tm;
    log_info("model compiled", "model=%" PRIu64 " layers=%d params=%zu batch_per_core=%d mixed_bf16=%d hbm_used=%" PRIu64,
             tm->id, tm->nlayers, model_num_params(tm->m), tm->batch, (int)sp->mixed_bfloat16, t->env.hbm->used);
    return CODE_OK;
}

/* ---- answers ---- */

static void treq_free(struct treq *r)
{
    if (!r)
        return;
    free(r->payload);
    free(r->out);
    tpuemu__model_spec__free_unpacked(r->spec, NULL);
    free(r);
}

static void answer_written(void *arg, int status)
{
    (void)status;
    treq_free(arg);
}

/* Sends the answer (if the client is still there) and frees r. */
static void answer(struct train *t, struct treq *r, const err *e)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__Status st = TPUEMU__STATUS__INIT;
    Tpuemu__StepStat *sp[TRAIN_MAX_STEPS];
    int ok = e->code == CODE_OK;

    if (!r->conn) {
        treq_free(r);
        return;
    }
    h.kind = KIND(MODEL_RESULT);
    h.epoch = r->epoch;
    h.seq = r->seq;
    st.code = (Tpuemu__Code)e->code;
    st.message = (char *)e->msg;
    h.status = &st;
    h.hbm_used = t->env.hbm->used;
    h.hbm_capacity = t->env.hbm->capacity;
    if (ok && r->kind == KIND(STEPS)) {
        for (uint32_t i = 0; i < r->steps; i++)
            sp[i] = &r->stats[i];
        h.n_step_stats = r->steps;
        h.step_stats = sp;
    }
    if (ok && r->has_state)
        h.state = &r->state;
    if (dp_conn_send_ref(r->conn, &h, ok ? r->out : NULL, ok ? r->out_len : 0, answer_written, r) != CODE_OK)
        treq_free(r);
}

static void answerf(struct train *t, struct treq *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void answerf(struct train *t, struct treq *r, int code, const char *fmt, ...)
{
    err e;
    va_list ap;
    va_start(ap, fmt);
    err_vset(&e, code, fmt, ap);
    va_end(ap);
    answer(t, r, &e);
}

/* The collectives r's remaining steps would have run: fail them on every peer. */
static void abort_rest(struct train *t, struct treq *r, uint32_t from, const err *e)
{
    if (r->kind != KIND(STEPS) || r->mode != TPUEMU__STEP_MODE__STEP_TRAIN || !t->env.coll ||
        t->env.id->num_replicas < 2 || r->epoch != t->env.id->epoch)
        return;
    for (uint32_t i = from; i < r->steps; i++)
        coll_abort(t->env.coll, r->coll_seq + i, e);
}

/* cur is done (answered or dropped): on to the next request. */
static void next(struct train *t)
{
    t->cur = NULL;
    kick(t);
}

/* ---- steps ---- */

static size_t label_bytes(const struct tmodel *tm, uint32_t rows)
{
    return (size_t)rows * (tm->sparse ? sizeof(int32_t) : sizeof(float) * (size_t)tm->label_dim);
}

static size_t step_bytes(const struct tmodel *tm, uint32_t rows, int has_labels)
{
    return (size_t)rows * (size_t)tm->in_dim * sizeof(float) + (has_labels ? label_bytes(tm, rows) : 0);
}

static void pool_step(uv_work_t *req)
{
    struct train *t = req->data;
    struct treq *r = t->cur;
    struct tmodel *tm = t->tm;
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
        flush_update(tm);
        r->t_opt0 = t0;
        r->t_opt1 = uv_hrtime();
        r->stats[r->i].optimizer_ns = r->t_opt1 - t0;
    }
    do {
        uint32_t i = r->i, rows = r->rows[i];
        const float *x = (const float *)(r->payload + r->off);
        const void *y = r->has_labels ? r->payload + r->off + (size_t)rows * tm->in_dim * sizeof(float) : NULL;
        Tpuemu__StepStat *s = &r->stats[i];
        struct model_metrics mt = {0, 0, 0};
        uint64_t c0 = uv_hrtime();
        double mm0 = model_matmul_seconds(tm->m);
        float *out = r->mode == TPUEMU__STEP_MODE__STEP_PREDICT ? (float *)(r->out + r->out_len) : NULL;

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
        if (t->env.throttle_pct < 100) { /* a slower chip: the step takes 100/pct as long */
            uint64_t spent = uv_hrtime() - c0, extra = spent * (uint64_t)(100 - t->env.throttle_pct) /
                                                        (uint64_t)t->env.throttle_pct;
            struct timespec ts = {(time_t)(extra / 1000000000u), (long)(extra % 1000000000u)};
            nanosleep(&ts, NULL);
        }
        r->st0[i] = c0;
        r->st1[i] = uv_hrtime();
        s->compute_ns = r->st1[i] - c0;
        s->matmul_ns = (uint64_t)((model_matmul_seconds(tm->m) - mm0) * 1e9);
        r->off += step_bytes(tm, rows, r->has_labels);
        if (r->mode == TPUEMU__STEP_MODE__STEP_TRAIN)
            break; /* the all-reduce follows on the loop */
        r->i++;
    } while (r->i < r->steps);
}

static void on_allreduce(void *arg, const err *e, const uint8_t *out, size_t out_len);

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
        trace_add(tr, &ev);
    }
}

static void after_step(uv_work_t *req, int status)
{
    struct train *t = req->data;
    struct treq *r = t->cur;
    (void)status;

    t->busy = 0;
    if (t->orphan) { /* the system was reset while the pool ran */
        tmodel_free(t->orphan);
        t->orphan = NULL;
        answerf(t, r, CODE_ABORTED, "the TPU system was re-initialized (epoch %" PRIu64 ") during step %" PRIu64,
                t->env.id->epoch, r->first_step + r->i);
        next(t);
        return;
    }
    if (r->e.code == CODE_OK)
        trace_pool(t, r);
    if (r->e.code != CODE_OK) {
        err e = r->e;
        err_prefix(&e, "step %" PRIu64 " on core %s/%d", r->first_step + r->i, t->env.id->host_id, t->env.id->core);
        log_warn("step failed", "step=%" PRIu64 " code=%s reason=%s", r->first_step + r->i, code_name(e.code),
                 log_q(e.msg));
        abort_rest(t, r, r->i, &e);
        answer(t, r, &e);
        next(t);
        return;
    }
    if (r->mode != TPUEMU__STEP_MODE__STEP_TRAIN) {
        answer(t, r, &r->e);
        next(t);
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
    h.seq = r->coll_seq + r->i;
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
        abort_rest(t, r, r->i + 1, &f);
        answer(t, r, &f);
        next(t);
        return;
    }
    if (out && (const float *)out != model_grads(tm->m) && out_len == model_num_params(tm->m) * sizeof(float))
        memcpy(model_grads(tm->m), out, out_len);
    prom_add(&t->env.stats->steps, 1);
    prom_hist_observe_ns(&t->env.stats->step_seconds, now - r->t_step0);
    tm->pending = 1;
    tm->pending_scale = 1.0f / (float)r->global_rows[r->i];
    if (++r->i < r->steps) {
        t->busy = 1;
        uv_queue_work(t->env.loop, &t->work, pool_step, after_step);
        return;
    }
    answer(t, r, e);
    next(t);
}

static void start_steps(struct train *t, struct treq *r)
{
    struct tmodel *tm = t->tm;
    if (r->mode == TPUEMU__STEP_MODE__STEP_PREDICT) {
        size_t total = 0;
        for (uint32_t i = 0; i < r->steps; i++)
            total += r->rows[i];
        r->out_len = 0;
        if (!(r->out = malloc(total * (size_t)tm->out_dim * sizeof(float) + 1))) {
            answerf(t, r, CODE_RESOURCE_EXHAUSTED, "out of memory for %zu predictions", total);
            next(t);
            return;
        }
    }
    r->i = 0;
    r->off = 0;
    t->busy = 1;
    uv_queue_work(t->env.loop, &t->work, pool_step, after_step);
}

/* ---- state ---- */

static void do_state_get(struct train *t, struct treq *r)
{
    struct tmodel *tm = t->tm;
    size_t np = model_num_params(tm->m);
    int ns = model_opt_num_slots(tm->m);
    flush_update(tm);
    if (!(r->out = malloc(np * sizeof(float) * (size_t)(1 + ns) + 1))) {
        answerf(t, r, CODE_RESOURCE_EXHAUSTED, "out of memory for the model state");
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
    answer(t, r, &ok);
}

static void do_state_set(struct train *t, struct treq *r)
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
    answer(t, r, &ok);
}

/* ---- the queue ---- */

static void kick(struct train *t)
{
    while (!t->cur && !t->busy && t->head) {
        struct treq *r = t->head;
        err e;
        t->head = r->next;
        if (!t->head)
            t->tail = NULL;
        t->n--;
        t->cur = r;
        if (!r->conn && r->kind != KIND(STEPS)) {
            treq_free(r);
            t->cur = NULL;
            continue;
        }
        if (r->epoch != t->env.id->epoch || t->env.id->replica_id < 0) {
            err_set(&e, CODE_FAILED_PRECONDITION,
                    "this request belongs to epoch %" PRIu64 "; the TPU system was re-initialized (now %" PRIu64
                    "): compile the model again", r->epoch, t->env.id->epoch);
            answer(t, r, &e);
            t->cur = NULL;
            continue;
        }
        if (t->tm && t->tm->failed &&
            (r->kind == KIND(COMPILE) || (r->kind == KIND(STEPS) && r->mode == TPUEMU__STEP_MODE__STEP_TRAIN))) {
            err_set(&e, CODE_FAILED_PRECONDITION, "a gradient all-reduce failed on core %s/%d (%s); re-initialize the "
                    "TPU system", t->env.id->host_id, t->env.id->core, t->tm->fail_err.msg);
            abort_rest(t, r, 0, &e);
            answer(t, r, &e);
            t->cur = NULL;
            continue;
        }
        if (r->kind == KIND(COMPILE)) {
            if (do_compile(t, r, &e) != CODE_OK)
                log_warn("compile failed", "code=%s reason=%s", code_name(e.code), log_q(e.msg));
            else
                err_clear(&e);
            answer(t, r, &e);
            t->cur = NULL;
            continue;
        }
        if (!t->tm || t->tm->id != r->model_id) {
            err_set(&e, CODE_FAILED_PRECONDITION, "model %" PRIu64 " is not compiled on core %s/%d%s", r->model_id,
                    t->env.id->host_id, t->env.id->core, t->tm ? " (another model is)" : "; compile it first");
            abort_rest(t, r, 0, &e);
            answer(t, r, &e);
            t->cur = NULL;
            continue;
        }
        if (r->kind == KIND(STATE_GET)) {
            do_state_get(t, r);
            t->cur = NULL;
            continue;
        }
        if (r->kind == KIND(STATE_SET)) {
            do_state_set(t, r);
            t->cur = NULL;
            continue;
        }
        if (t->idle_since) {
            uint64_t now = uv_hrtime();
            r->stats[0].infeed_wait_ns = now - t->idle_since;
            if (r->kind == KIND(STEPS) && r->mode == TPUEMU__STEP_MODE__STEP_TRAIN)
                trace_span(t->env.trace, TPUEMU__TRACE_KIND__TRACE_INFEED_WAIT, t->idle_since, now, r->first_step);
            t->idle_since = 0;
        }
        start_steps(t, r);
        return;
    }
    if (!t->cur && !t->busy && !t->head && t->tm && !t->idle_since)
        t->idle_since = uv_hrtime();
}

/* ---- frames ---- */

int train_is_frame(const Tpuemu__FrameHeader *h)
{
    return h->kind == KIND(COMPILE) || h->kind == KIND(STEPS) || h->kind == KIND(STATE_GET) ||
           h->kind == KIND(STATE_SET);
}

static int check_steps(struct train *t, const Tpuemu__StepsSpec *s, uint64_t *bytes, err *e)
{
    struct tmodel *tm = t->tm;
    uint64_t total = 0;
    if (!s)
        return err_set(e, CODE_INVALID_ARGUMENT, "STEPS without a steps spec");
    if (!tm || tm->id != s->model_id)
        return CODE_OK; /* answered in order, with the reason, by kick */
    if ((unsigned)s->mode > TPUEMU__STEP_MODE__STEP_PREDICT)
        return err_set(e, CODE_INVALID_ARGUMENT, "steps.mode %d is not TRAIN, EVALUATE or PREDICT", (int)s->mode);
    if (s->steps < 1 || s->steps > (uint32_t)tm->spe)
        return err_set(e, CODE_INVALID_ARGUMENT, "steps.steps %u is outside 1..%d (the model's steps_per_execution)",
                       s->steps, tm->spe);
    if (s->n_rows != s->steps || s->n_global_rows != s->steps)
        return err_set(e, CODE_INVALID_ARGUMENT, "steps.rows and steps.global_rows need %u entries each, not %zu and %zu",
                       s->steps, s->n_rows, s->n_global_rows);
    if (s->mode == TPUEMU__STEP_MODE__STEP_TRAIN && !s->has_labels)
        return err_set(e, CODE_INVALID_ARGUMENT, "a training step needs labels");
    for (uint32_t i = 0; i < s->steps; i++) {
        if (s->rows[i] > (uint32_t)tm->batch)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "step %u has %u rows on this core; the model was compiled for at most %d per core "
                           "(compile it for the larger batch)", i, s->rows[i], tm->batch);
        if (s->global_rows[i] < s->rows[i] || (s->mode == TPUEMU__STEP_MODE__STEP_TRAIN && s->global_rows[i] == 0))
            return err_set(e, CODE_INVALID_ARGUMENT, "step %u: global_rows %u is less than this core's %u rows or 0",
                           i, s->global_rows[i], s->rows[i]);
        total += step_bytes(tm, s->rows[i], s->has_labels);
    }
    *bytes = total;
    return CODE_OK;
}

int train_check_payload(struct train *t, const Tpuemu__FrameHeader *h, err *e)
{
    uint64_t want = 0;
    int rc;
    if (!t)
        return err_set(e, CODE_UNAVAILABLE, "the training service of this core is not running");
    if (h->kind == KIND(STEPS)) {
        if ((rc = check_steps(t, h->steps, &want, e)) != CODE_OK)
            return rc;
        if (!t->tm || !h->steps || t->tm->id != h->steps->model_id)
            want = h->payload_bytes > 0 ? UINT64_MAX : 0;
    } else if (h->kind == KIND(STATE_SET)) {
        if (!h->state)
            return err_set(e, CODE_INVALID_ARGUMENT, "STATE_SET without a state description");
        if (!t->tm || t->tm->id != h->state->model_id)
            return err_set(e, CODE_FAILED_PRECONDITION, "model %" PRIu64 " is not compiled on core %s/%d",
                           h->state->model_id, t->env.id->host_id, t->env.id->core);
        size_t np = model_num_params(t->tm->m);
        int ns = model_opt_num_slots(t->tm->m);
        if (h->state->num_params != np || h->state->num_slots != (uint32_t)ns)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "the state has %" PRIu64 " parameters and %u optimizer slots; the compiled model has %zu "
                           "and %d", h->state->num_params, h->state->num_slots, np, ns);
        want = (uint64_t)np * sizeof(float) * (uint64_t)(1 + ns);
    }
    if (h->payload_bytes != want)
        return err_set(e, CODE_INVALID_ARGUMENT,
                       want == UINT64_MAX ? "a STEPS payload of %" PRIu64 " bytes for a model that is not compiled here"
                                          : "the payload is %" PRIu64 " bytes; %" PRIu64 " were expected",
                       h->payload_bytes, want);
    return CODE_OK;
}

/* The client's side of a STEPS request (sent to the first replica): its wait
 * for the dataset and the request's way here, on our clock. */
static void record_client(struct train *t, const Tpuemu__StepsSpec *s, size_t len)
{
    uint64_t now = uv_hrtime();
    int64_t off = (int64_t)(now - s->client_post_ns);
    struct trace_ev ev = {0};

    if (!s->client_post_ns || s->client_input_start_ns > s->client_post_ns)
        return;
    if (s->client_pid != t->client_pid || off < t->client_off) {
        t->client_pid = s->client_pid;
        t->client_off = off;
    }
    ev.kind = TPUEMU__TRACE_KIND__TRACE_CLIENT_INPUT;
    ev.t0 = s->client_input_start_ns + (uint64_t)t->client_off;
    ev.dur = s->client_input_wait_ns;
    ev.step = s->first_step;
    ev.peer = (int32_t)s->client_pid;
    trace_add(t->env.trace, &ev);
    ev.kind = TPUEMU__TRACE_KIND__TRACE_CLIENT_INFEED;
    ev.t0 = s->client_post_ns + (uint64_t)t->client_off;
    ev.dur = now > ev.t0 ? now - ev.t0 : 0;
    ev.bytes = len;
    trace_add(t->env.trace, &ev);
}

void train_on_client_frame(struct train *t, dp_conn *c, const Tpuemu__FrameHeader *h, uint8_t *payload,
                           size_t len)
{
    struct treq *r = calloc(1, sizeof *r);
    err e;

    if (!r) {
        free(payload);
        dp_conn_fail(c, CODE_RESOURCE_EXHAUSTED, "out of memory for a training request");
        return;
    }
    for (size_t i = 0; i < TRAIN_MAX_STEPS; i++)
        tpuemu__step_stat__init(&r->stats[i]);
    tpuemu__state_info__init(&r->state);
    r->t = t;
    r->conn = c;
    r->kind = h->kind;
    r->seq = h->seq;
    r->epoch = h->epoch;
    r->payload = payload;
    (void)len; /* checked against the model by train_check_payload */
    if (h->kind == KIND(COMPILE)) {
        if (!h->model) {
            answerf(t, r, CODE_INVALID_ARGUMENT, "COMPILE without a model");
            return;
        }
        if (!(r->spec = spec_copy(h->model))) {
            answerf(t, r, CODE_RESOURCE_EXHAUSTED, "out of memory for the model");
            return;
        }
        r->model_id = h->model->model_id;
    } else if (h->kind == KIND(STEPS)) {
        uint64_t bytes = 0;
        const Tpuemu__StepsSpec *s = h->steps;
        if (check_steps(t, s, &bytes, &e) != CODE_OK) {
            answer(t, r, &e);
            return;
        }
        r->model_id = s->model_id;
        r->mode = s->mode;
        r->has_labels = s->has_labels;
        r->steps = s->n_rows < TRAIN_MAX_STEPS ? (uint32_t)s->n_rows : TRAIN_MAX_STEPS;
        if (r->steps > s->steps)
            r->steps = s->steps;
        for (uint32_t i = 0; i < r->steps; i++) {
            r->rows[i] = s->rows[i];
            r->global_rows[i] = i < s->n_global_rows ? s->global_rows[i] : 0;
        }
        r->coll_seq = s->coll_seq;
        r->first_step = s->first_step;
        record_client(t, s, len);
        if (t->tm && t->n >= (unsigned)t->tm->depth + TRAIN_QUEUE_SLACK) {
            err_set(&e, CODE_RESOURCE_EXHAUSTED,
                    "%u requests are already queued on core %s/%d (infeed depth %d): wait for their answers",
                    t->n, t->env.id->host_id, t->env.id->core, t->tm->depth);
            abort_rest(t, r, 0, &e);
            answer(t, r, &e);
            return;
        }
    } else if (h->kind == KIND(STATE_GET)) {
        r->model_id = h->state ? h->state->model_id : 0;
    } else {
        r->model_id = h->state->model_id; /* checked by train_check_payload */
        r->state.model_id = h->state->model_id;
        r->state.num_params = h->state->num_params;
        r->state.num_slots = h->state->num_slots;
        r->state.iterations = h->state->iterations;
    }
    if (t->tail)
        t->tail->next = r;
    else
        t->head = r;
    t->tail = r;
    t->n++;
    kick(t);
}

void train_on_client_close(struct train *t, dp_conn *c)
{
    struct treq **pp;
    err e;
    if (!t)
        return;
    err_set(&e, CODE_ABORTED, "the client's data connection to core %s/%d closed", t->env.id->host_id, t->env.id->core);
    if (t->cur && t->cur->conn == c)
        t->cur->conn = NULL; /* the step in flight still joins its all-reduce */
    for (pp = &t->head; *pp;) {
        struct treq *r = *pp;
        if (r->conn != c) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        t->n--;
        abort_rest(t, r, 0, &e);
        treq_free(r);
    }
    t->tail = NULL;
    for (struct treq *r = t->head; r; r = r->next)
        t->tail = r;
}

void train_reset(struct train *t)
{
    if (!t)
        return;
    /* queued requests are answered by kick (their epoch is gone) */
    if (t->tm) {
        if (t->busy)
            t->orphan = t->tm; /* freed when the pool gives it back */
        else
            tmodel_free(t->tm);
        t->tm = NULL;
    }
    t->idle_since = 0;
    kick(t);
}

int train_new(const struct train_env *env, struct train **out)
{
    struct train *t = calloc(1, sizeof *t);
    err e;
    *out = NULL;
    if (!t)
        return CODE_RESOURCE_EXHAUSTED;
    if (mxu_new(&t->u, (unsigned)env->preset->mxu_dim, &e) != CODE_OK) {
        log_error("no matrix unit", "reason=%s", log_q(e.msg));
        free(t);
        return e.code;
    }
    t->env = *env;
    t->work.data = t;
    *out = t;
    return CODE_OK;
}

void train_free(struct train *t)
{
    if (!t)
        return;
    while (t->head) {
        struct treq *r = t->head;
        t->head = r->next;
        treq_free(r);
    }
    treq_free(t->cur);
    tmodel_free(t->tm);
    tmodel_free(t->orphan);
    mxu_free(t->u);
    free(t);
}

void train_stats_init(struct train_stats *s)
{
    atomic_init(&s->steps, 0);
    prom_hist_init(&s->step_seconds, step_bounds, sizeof step_bounds / sizeof step_bounds[0]);
}
