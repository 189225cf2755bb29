/* The profiler's request on the wire (profile_io.h): the PROFILE frame out,
 * the PROFILE_RESULT in over dpio's loop, and the answer's ProfileInfo and
 * packed TraceEvents turned into plain C. */
#include "profile_io.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client.h"
#include "frame.h"

#define KIND(k) TPUEMU__FRAME_KIND__FRAME_##k

#define SAME(k) ((int)PROF_KIND_##k == (int)TPUEMU__TRACE_KIND__TRACE_##k)
_Static_assert(SAME(STEP) && SAME(INFEED_WAIT) && SAME(OPTIMIZER) && SAME(FORWARD) && SAME(BACKWARD) && SAME(MATMUL) &&
                   SAME(ALLREDUCE) && SAME(SEND) && SAME(RECV) && SAME(EVAL) && SAME(CLIENT_INPUT) &&
                   SAME(CLIENT_INFEED) && SAME(FAULT),
               "enum prof_kind follows TraceKind");
#undef SAME

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One PROFILE request and its answer on one core's connection (dpio.h). */
struct ask {
    struct dpio_conn *peer;
    uint64_t seq;
    Tpuemu__ProfileInfo *info; /* taken out of the answer's header */
    uint8_t *pl;               /* the answer's payload: packed TraceEvents */
    uint64_t pl_len;
    int64_t t_got;
    int done, rc;
    err *e;
};

static int ask_header(void *arg, size_t i, Tpuemu__FrameHeader *a, void **dst)
{
    struct ask *k = arg;
    struct dpio_conn *peer = k->peer;
    (void)i;
    k->t_got = now_ns();
    if (a->kind == KIND(ERROR)) {
        k->rc = err_set(k->e, a->status && a->status->code ? (int)a->status->code : CODE_UNKNOWN,
                        "core %s/%d refused the profile request: %s", peer->host, peer->core,
                        a->status && a->status->message ? a->status->message : "");
        return DPIO_LOST;
    }
    if (a->kind != KIND(PROFILE_RESULT) || a->seq != k->seq || !a->profile_info) {
        /* anything else on this connection is not ours to read */
        k->rc = err_set(k->e, CODE_INTERNAL, "core %s/%d answered a profile request with a frame of kind %d",
                        peer->host, peer->core, (int)a->kind);
        return DPIO_LOST;
    }
    if (a->payload_bytes && !(k->pl = malloc(a->payload_bytes))) {
        k->rc = err_set(k->e, CODE_RESOURCE_EXHAUSTED, "out of memory for a profile of %" PRIu64 " bytes",
                        a->payload_bytes);
        return DPIO_LOST;
    }
    k->pl_len = a->payload_bytes;
    k->info = a->profile_info;
    a->profile_info = NULL;
    *dst = k->pl;
    return DPIO_PAYLOAD;
}

static int ask_frame(void *arg, size_t i, uint64_t got)
{
    (void)i;
    (void)got;
    ((struct ask *)arg)->done = 1;
    return 1;
}

static void ask_lost(void *arg, size_t i, int code, const char *msg)
{
    struct ask *k = arg;
    (void)i;
    (void)code;
    if (k->rc == CODE_OK)
        k->rc = err_set(k->e, CODE_UNAVAILABLE, "%s", msg);
}

static int ask_state(void *arg)
{
    const struct ask *k = arg;
    return k->done || k->rc != CODE_OK ? DPIO_DONE : DPIO_MORE;
}

static void info_from(const Tpuemu__ProfileInfo *pi, struct prof_info *o)
{
    memset(o, 0, sizeof *o);
    o->now_ns = pi->now_ns;
    o->dropped = pi->dropped;
    o->oldest_ns = pi->oldest_ns;
    o->truncated = pi->truncated;
    o->replica = pi->replica;
    snprintf(o->tpu_type, sizeof o->tpu_type, "%s", pi->tpu_type ? pi->tpu_type : "");
    o->hbm_used = pi->hbm_used;
    o->hbm_peak = pi->hbm_peak;
    o->hbm_capacity = pi->hbm_capacity;
    o->peak_bf16_flops = pi->peak_bf16_flops;
    o->hbm_bandwidth = pi->hbm_bandwidth;
    o->ici_bandwidth = pi->ici_bandwidth;
    o->mxu_dim = pi->mxu_dim;
    o->host_cpus = pi->host_cpus;
    snprintf(o->boot_id, sizeof o->boot_id, "%s", pi->boot_id ? pi->boot_id : "");
    o->host_service = pi->host_service;
    snprintf(o->host_id, sizeof o->host_id, "%s", pi->host_id ? pi->host_id : "");
    snprintf(o->resolver, sizeof o->resolver, "%s", pi->resolver ? pi->resolver : "");
}

static int events_from(const Tpuemu__TraceEvents *te, struct prof_event **out, size_t *n)
{
    struct prof_event *v;
    *out = NULL;
    *n = 0;
    if (!te->n_events)
        return CODE_OK;
    if (!(v = calloc(te->n_events, sizeof *v)))
        return CODE_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < te->n_events; i++) {
        const Tpuemu__TraceEvent *s = te->events[i];
        struct prof_event *d = &v[i];
        d->kind = (uint32_t)s->kind;
        d->t0_ns = s->t0_ns;
        d->dur_ns = s->dur_ns;
        d->step = s->step;
        d->layer = s->layer;
        d->op = s->op;
        d->m = s->m;
        d->n = s->n;
        d->k = s->k;
        d->bytes = s->bytes;
        d->seq = s->seq;
        d->coll_step = s->coll_step;
        d->chunk = s->chunk;
        d->peer = s->peer;
        snprintf(d->algo, sizeof d->algo, "%s", s->algo ? s->algo : "");
    }
    *out = v;
    *n = te->n_events;
    return CODE_OK;
}

int profile_io_ask(struct dpio_conn *peer, uint64_t seq, uint64_t since_ns, uint64_t until_ns, uint32_t max,
                   uint32_t io_ms, uint64_t max_payload, const struct cli_cancel *cancel, struct prof_info *info,
                   struct prof_event **ev, size_t *nev, int64_t *t_sent, int64_t *t_got, err *e)
{
    static const struct dpio_ops ops = {ask_header, ask_frame, ask_lost, ask_state};
    Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
    Tpuemu__ProfileRequest rq = TPUEMU__PROFILE_REQUEST__INIT;
    Tpuemu__TraceEvents *te = NULL;
    struct ask k = {peer, seq, NULL, NULL, 0, 0, 0, CODE_OK, e};
    struct dpio_run run = {&ops, &k, "the profile request", wire_now_ms() + io_ms, 0, 0, cancel};
    enum dpio_end end;
    int rc;

    *ev = NULL;
    *nev = 0;
    rq.since_ns = since_ns;
    rq.until_ns = until_ns;
    rq.max_events = max;
    h.kind = KIND(PROFILE);
    h.seq = seq;
    h.profile = &rq;
    if ((rc = dpio_send(peer, &h, NULL, 0)) != CODE_OK)
        return err_set(e, rc == CODE_INVALID_ARGUMENT ? CODE_INTERNAL : rc, "%s",
                       rc == CODE_INVALID_ARGUMENT ? "profile request does not fit a frame" : "out of memory");
    *t_sent = now_ns();
    peer->reading = 1;
    peer->max_payload = max_payload;
    end = dpio_run(peer, 1, &run);
    peer->reading = 0;
    if (k.rc == CODE_OK && !k.done)
        k.rc = end == DPIO_END_NOMEM ? err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory")
               : end == DPIO_END_CANCELLED
                   ? cli_cancelled("the profile capture", e)
                   : err_set(e, CODE_UNAVAILABLE,
                             "core %s/%d at %s: profile: the data-plane peer did not answer in time", peer->host,
                             peer->core, peer->addr);
    if (k.rc == CODE_OK && k.pl_len && !(te = tpuemu__trace_events__unpack(NULL, k.pl_len, k.pl)))
        k.rc = err_set(e, CODE_DATA_LOSS, "core %s/%d sent a profile that does not decode", peer->host, peer->core);
    free(k.pl);
    if (k.rc == CODE_OK && te && events_from(te, ev, nev) != CODE_OK)
        k.rc = err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for the profile of core %s/%d", peer->host,
                       peer->core);
    if (te)
        tpuemu__trace_events__free_unpacked(te, NULL);
    if (k.rc == CODE_OK) {
        info_from(k.info, info);
        *t_got = k.t_got;
    }
    if (k.info)
        tpuemu__profile_info__free_unpacked(k.info, NULL);
    return k.rc;
}
