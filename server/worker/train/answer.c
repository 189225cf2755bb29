/* Answers of the training service: one MODEL_RESULT per request, in order,
 * written straight from the request's buffers; and aborting, on every peer,
 * the gradient all-reduces a request will not run. */
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "train_int.h"

void treq_free(struct treq *r)
{
    if (!r)
        return;
    free(r->payload);
    free(r->out);
    free(r->hin);
    tpuemu__model_spec__free_unpacked(r->spec, NULL);
    free(r);
}

static void answer_written(void *arg, int status)
{
    (void)status;
    treq_free(arg);
}

/* Sends the answer (if the client is still there) and frees r; a fanned-out
 * request's joins its fan (fanout.c). */
void treq_answer(struct train *t, struct treq *r, const err *e)
{
    err down;

    /* a core down for maintenance left its system in the middle of this
     * request: whatever broke (its model and HBM are gone) is that */
    if (e->code != CODE_OK && t->env.notice && t->env.notice->under_way) {
        uint64_t now = uv_now(t->env.loop), end = t->env.notice->event_ms + t->env.notice->window_ms;
        err_set(&down, CODE_UNAVAILABLE, "core %s/%d went down for a maintenance event during this request (its "
                "model and HBM went with it); it is back in %" PRIu64 " ms", t->env.id->host_id, t->env.id->core,
                end > now ? end - now : 0);
        e = &down;
    }
    if (r->fan) {
        fan_own(t, r->fan, r, e);
        treq_free(r);
        return;
    }
    if (!fan_hold(t, r, e))
        treq_send(t, r, e);
}

void treq_send(struct train *t, struct treq *r, const err *e)
{
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__Status st = TPUEMU__STATUS__INIT;
    Tpuemu__StepStat *sp[TRAIN_MAX_STEPS];
    Tpuemu__Notice nt = TPUEMU__NOTICE__INIT;
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
    if (notice_fill(t->env.notice, uv_now(t->env.loop), &nt))
        h.notice = &nt;
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

void treq_answerf(struct train *t, struct treq *r, int code, const char *fmt, ...)
{
    err e;
    va_list ap;
    va_start(ap, fmt);
    err_vset(&e, code, fmt, ap);
    va_end(ap);
    treq_answer(t, r, &e);
}

/* The collectives r's remaining steps would have run: fail them on every peer. */
void treq_abort_rest(struct train *t, struct treq *r, uint32_t from, const err *e)
{
    if (r->kind != KIND(STEPS) || r->mode != TPUEMU__STEP_MODE__STEP_TRAIN || !t->env.coll ||
        t->env.id->num_replicas < 2 || r->epoch != t->env.id->epoch)
        return;
    /* each step: the synchronized layers' sums, then its gradients (sync.c) */
    uint64_t per = 1 + (uint64_t)(t->tm ? model_sync_calls(t->tm->m) : 0);
    for (uint32_t i = from; i < r->steps; i++)
        for (uint64_t k = 0; k < per; k++)
            coll_abort(t->env.coll, r->coll_seq + i * per + k, e);
}

