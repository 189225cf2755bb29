/* The training service of one core (train.h): the request queue, one
 * request at a time in arrival order, and the service's API. The step machine
 * (steps.c), the answers (answer.c) and the models' HBM charges (charge.c)
 * lie below it (train_int.h). */
#include "train.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "log.h"
#include "train_int.h"

/* A request for the model the last reset dropped: the core was reset since it
 * was compiled (an initialize elsewhere, or its restart at the end of a
 * maintenance event), as a TPU worker that restarted has lost its programs:
 * UNAVAILABLE, worth initializing again, which is what a client that lost a
 * core does. */
static int lost(struct train *t, uint64_t model_id, err *e)
{
    return err_set(e, CODE_UNAVAILABLE,
                   "core %s/%d no longer has model %" PRIu64 ": it was reset since the model was compiled (an "
                   "initialize, or its restart at the end of a maintenance event); initialize the TPU system again",
                   t->env.id->host_id, t->env.id->core, model_id);
}

static void kick(struct train *t);

/* Steps of a small model take well under a millisecond, a large batch's tens
 * of milliseconds; a straggler or a loaded machine seconds. */
static const double step_bounds[] = {0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                     0.05,    0.1,    0.25,  0.5,    1,     2.5,   5};

/* cur is done (answered or dropped): on to the next request. */
static void next(struct train *t)
{
    t->cur = NULL;
    kick(t);
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
            treq_answer(t, r, &e);
            t->cur = NULL;
            continue;
        }
        if (t->tm && t->tm->failed &&
            (r->kind == KIND(COMPILE) || (r->kind == KIND(STEPS) && r->mode == TPUEMU__STEP_MODE__STEP_TRAIN))) {
            err_set(&e, CODE_FAILED_PRECONDITION, "a gradient all-reduce failed on core %s/%d (%s); re-initialize the "
                    "TPU system", t->env.id->host_id, t->env.id->core, t->tm->fail_err.msg);
            treq_abort_rest(t, r, 0, &e);
            treq_answer(t, r, &e);
            t->cur = NULL;
            continue;
        }
        if (r->kind == KIND(COMPILE)) {
            if (tm_compile(t, r, &e) != CODE_OK)
                log_warn("compile failed", "code=%s reason=%s", code_name(e.code), log_q(e.msg));
            else
                err_clear(&e);
            treq_answer(t, r, &e);
            t->cur = NULL;
            continue;
        }
        if (!t->tm && t->lost_model && r->model_id == t->lost_model) {
            lost(t, r->model_id, &e);
            treq_abort_rest(t, r, 0, &e);
            treq_answer(t, r, &e);
            t->cur = NULL;
            continue;
        }
        if (!t->tm || t->tm->id != r->model_id) {
            err_set(&e, CODE_FAILED_PRECONDITION, "model %" PRIu64 " is not compiled on core %s/%d%s", r->model_id,
                    t->env.id->host_id, t->env.id->core, t->tm ? " (another model is)" : "; compile it first");
            treq_abort_rest(t, r, 0, &e);
            treq_answer(t, r, &e);
            t->cur = NULL;
            continue;
        }
        if (r->kind == KIND(STATE_GET)) {
            steps_state_get(t, r);
            t->cur = NULL;
            continue;
        }
        if (r->kind == KIND(STATE_SET)) {
            steps_state_set(t, r);
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
        steps_start(t, r);
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
    if (fan_check(t, s, e) != CODE_OK)
        return e->code;
    if (s->host_input && (!tm || tm->id != s->model_id)) { /* checked before anything else is */
        struct hin_spec *hs = NULL;
        int rc = s->n_rows == s->steps
                     ? steps_host_input(NULL, s, &hs, e)
                     : err_set(e, CODE_INVALID_ARGUMENT, "steps.rows needs %u entries, not %zu", s->steps, s->n_rows);
        free(hs);
        if (rc != CODE_OK)
            return rc;
    }
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
    if (s->host_input) {
        if (s->x_dtype != TPUEMU__DTYPE__DTYPE_F32)
            return err_set(e, CODE_INVALID_ARGUMENT, "steps.x_dtype is set for host-side input (the host makes x)");
        struct hin_spec *hs = NULL;
        int rc = steps_host_input(tm, s, &hs, e);
        free(hs);
        if (rc != CODE_OK)
            return rc;
        *bytes = 0; /* the core's host makes the infeed */
        return CODE_OK;
    }
    if (s->x_dtype != TPUEMU__DTYPE__DTYPE_F32 && (s->x_dtype != TPUEMU__DTYPE__DTYPE_BF16 || !tm->bf16_in))
        return err_set(e, CODE_INVALID_ARGUMENT,
                       s->x_dtype == TPUEMU__DTYPE__DTYPE_BF16
                           ? "a bfloat16 infeed for a model that takes float32 (not mixed_bfloat16, or its first "
                             "layer is not a Dense or Conv2D)"
                           : "steps.x_dtype %d is not F32 or BF16",
                       (int)s->x_dtype);
    if (s->x_dtype == TPUEMU__DTYPE__DTYPE_BF16 && !tm->xw &&
        !(tm->xw = malloc((size_t)tm->batch * (size_t)tm->in_dim * sizeof(float))))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for the infeed of %d rows", tm->batch);
    for (uint32_t i = 0; i < s->steps; i++) {
        if (s->rows[i] > (uint32_t)tm->batch)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "step %u has %u rows on this core; the model was compiled for at most %d per core "
                           "(compile it for the larger batch)", i, s->rows[i], tm->batch);
        if (s->global_rows[i] < s->rows[i] || (s->mode == TPUEMU__STEP_MODE__STEP_TRAIN && s->global_rows[i] == 0))
            return err_set(e, CODE_INVALID_ARGUMENT, "step %u: global_rows %u is less than this core's %u rows or 0",
                           i, s->global_rows[i], s->rows[i]);
        total += steps_bytes(tm, s->rows[i], s->has_labels, s->x_dtype == TPUEMU__DTYPE__DTYPE_BF16);
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
        if (h->steps && !t->tm && t->lost_model && h->steps->model_id == t->lost_model)
            return lost(t, h->steps->model_id, e);
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
    if (t->env.notice && t->env.notice->under_way) {
        uint64_t now = uv_now(t->env.loop), end = t->env.notice->event_ms + t->env.notice->window_ms;
        treq_answerf(t, r, CODE_UNAVAILABLE, "core %s/%d is down for a maintenance event for %llu more ms; "
                     "initialize the TPU system again once it is back", t->env.id->host_id, t->env.id->core,
                     (unsigned long long)(end > now ? end - now : 0));
        return;
    }
    if (h->kind == KIND(COMPILE)) {
        if (!h->model) {
            treq_answerf(t, r, CODE_INVALID_ARGUMENT, "COMPILE without a model");
            return;
        }
        if (!(r->spec = tm_spec_copy(h->model))) {
            treq_answerf(t, r, CODE_RESOURCE_EXHAUSTED, "out of memory for the model");
            return;
        }
        r->model_id = h->model->model_id;
    } else if (h->kind == KIND(STEPS)) {
        uint64_t bytes = 0;
        const Tpuemu__StepsSpec *s = h->steps;
        if (check_steps(t, s, &bytes, &e) != CODE_OK) {
            treq_answer(t, r, &e);
            return;
        }
        r->model_id = s->model_id;
        r->mode = s->mode;
        r->has_labels = s->has_labels;
        r->x_bf16 = s->x_dtype == TPUEMU__DTYPE__DTYPE_BF16;
        r->steps = s->n_rows < TRAIN_MAX_STEPS ? (uint32_t)s->n_rows : TRAIN_MAX_STEPS;
        if (r->steps > s->steps)
            r->steps = s->steps;
        for (uint32_t i = 0; i < r->steps; i++) {
            r->rows[i] = s->rows[i];
            r->global_rows[i] = i < s->n_global_rows ? s->global_rows[i] : 0;
        }
        r->coll_seq = s->coll_seq;
        r->first_step = s->first_step;
        if (s->host_input) {
            const Tpuemu__HostInput *hi = s->host_input;
            if (steps_host_input(t->tm, s, &r->hin, &e) != CODE_OK) {
                treq_abort_rest(t, r, 0, &e);
                treq_answer(t, r, &e);
                return;
            }
            r->hin_id = hi->input_pipeline_id;
            r->hin_num = hi->num_input_pipelines;
            r->hin_epoch = hi->epoch;
            for (uint32_t i = 0; i < r->steps; i++)
                r->hin_batch[i] = hi->batches[i];
        }
        record_client(t, s, len);
        if (t->tm && t->n >= (unsigned)t->tm->depth + TRAIN_QUEUE_SLACK) {
            err_set(&e, CODE_RESOURCE_EXHAUSTED,
                    "%u requests are already queued on core %s/%d (infeed depth %d): wait for their answers",
                    t->n, t->env.id->host_id, t->env.id->core, t->tm->depth);
            treq_abort_rest(t, r, 0, &e);
            treq_answer(t, r, &e);
            return;
        }
        if (s->fanout && fan_start(t, c, h, &r->fan, &e) != CODE_OK) {
            treq_abort_rest(t, r, 0, &e);
            treq_answer(t, r, &e);
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
        treq_abort_rest(t, r, 0, &e);
        if (r->fan)
            fan_own(t, r->fan, r, &e);
        treq_free(r);
    }
    fan_conn_closed(t, c);
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
        t->lost_model = t->tm->id;
        if (t->busy)
            t->orphan = t->tm; /* freed when the pool gives it back */
        else
            tm_free(t->tm);
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
    if (sync_init(t) != CODE_OK) {
        log_error("no async handle for the replicas' sums", "reason=%s", "uv_async_init failed");
        mxu_free(t->u);
        free(t);
        return CODE_INTERNAL;
    }
    atomic_init(&t->throttle_pct, env->throttle_pct > 0 && env->throttle_pct <= 100 ? env->throttle_pct : 100);
    t->next = next;
    t->work.data = t;
    *out = t;
    return CODE_OK;
}

void train_set_throttle(struct train *t, int pct)
{
    atomic_store_explicit(&t->throttle_pct, pct < 1 ? 1 : pct > 100 ? 100 : pct, memory_order_relaxed);
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
    fan_free_all(t);
    tm_free(t->tm);
    tm_free(t->orphan);
    for (int i = 0; i < TRAIN_MAX_PIPES; i++)
        hin_close(t->pipes[i]);
    mxu_free(t->u);
    sync_destroy(t);
    free(t);
}

void train_stop(struct train *t)
{
    if (t) {
        sync_close(t);
        fan_stop(t);
    }
}

void train_stats_init(struct train_stats *s)
{
    atomic_init(&s->steps, 0);
    s->last_step = s->last_step_ns = s->last_allreduce_ns = 0;
    prom_hist_init(&s->step_seconds, step_bounds, sizeof step_bounds / sizeof step_bounds[0]);
}
