/* The client side of a collective on the wire (coll_io.h): every replica's
 * FRAME_COLL and input queued on its core's data connection, and dpio's loop
 * drives them all at once, so a core answering (or failing) while inputs are
 * still being written never deadlocks the call. This file only says what a
 * right answer looks like. */
#include "coll_io.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

#define KIND(k) TPUEMU__FRAME_KIND__FRAME_##k

enum { X_CLEAN = 1, X_ERRFRAME = 2 };

struct xrun {
    struct dpio_conn *conns;
    const struct cli_part *parts;
    struct cli_res *res;
    unsigned char *x; /* X_* per replica */
    size_t n, open;
    uint64_t seq;
    const char *what;
};

static void set_res(struct cli_res *res, int code, int from_core, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void set_res(struct cli_res *res, int code, int from_core, const char *fmt, ...)
{
    va_list ap;
    if (res->mono_ms)
        return; /* the first word stands */
    res->code = code;
    res->from_core = from_core;
    res->mono_ms = wire_now_ms();
    va_start(ap, fmt);
    vsnprintf(res->msg, sizeof res->msg, fmt, ap);
    va_end(ap);
}

/* A whole result header arrived: check it and say where its payload goes. */
static int on_header(void *arg, size_t r, Tpuemu__FrameHeader *h, void **dst)
{
    struct xrun *k = arg;
    struct dpio_conn *p = &k->conns[r];
    const struct cli_part *part = &k->parts[r];
    struct cli_res *res = &k->res[r];
    unsigned long long seq = (unsigned long long)k->seq;

    if (h->kind == KIND(ERROR)) {
        set_res(res, h->status && h->status->code ? (int)h->status->code : CODE_UNKNOWN, 1, "%s",
                h->status && h->status->message && *h->status->message ? h->status->message
                                                                        : "the core refused the collective");
        k->x[r] |= X_ERRFRAME;
        return DPIO_NO_PAYLOAD; /* an ERROR closes the connection */
    }
    if (h->kind != KIND(COLL_RESULT)) {
        dpio_failf(p, CODE_INTERNAL, "answered %s #%llu with frame kind %d", k->what, seq, (int)h->kind);
        return DPIO_LOST;
    }
    if (h->seq != k->seq) {
        dpio_failf(p, CODE_INTERNAL, "answered collective #%llu while #%llu was expected",
                   (unsigned long long)h->seq, seq);
        return DPIO_LOST;
    }
    if (h->status && h->status->code != TPUEMU__CODE__OK) {
        set_res(res, (int)h->status->code, 1, "%s",
                h->status->message && *h->status->message ? h->status->message : "the collective failed");
        return DPIO_PAYLOAD; /* read and dropped */
    }
    if (h->payload_bytes != part->out_len) {
        dpio_failf(p, CODE_INTERNAL, "returned %llu bytes for %s #%llu, expected %zu",
                   (unsigned long long)h->payload_bytes, k->what, seq, part->out_len);
        return DPIO_LOST;
    }
    if (!dpio_sent_all(p) && part->out_len) {
        dpio_failf(p, CODE_INTERNAL, "answered %s #%llu before it had read all of its input", k->what, seq);
        return DPIO_LOST;
    }
    *dst = part->out;
    res->ns = h->elapsed_ns;
    res->p50_ns = h->elapsed_p50_ns;
    snprintf(res->algo, sizeof res->algo, "%s", h->algo_used ? h->algo_used : "");
    return DPIO_PAYLOAD; /* the OK result is recorded only once its payload is in */
}

static int on_frame(void *arg, size_t r, uint64_t got)
{
    struct xrun *k = arg;
    struct cli_res *res = &k->res[r];
    (void)got;
    if (!res->mono_ms) {
        res->code = CODE_OK;
        res->msg[0] = '\0';
        res->from_core = 1;
        res->mono_ms = wire_now_ms();
    }
    if (dpio_sent_all(&k->conns[r]) && !(k->x[r] & X_ERRFRAME))
        k->x[r] |= X_CLEAN;
    k->open--;
    return 1; /* one result per collective */
}

static void on_lost(void *arg, size_t r, int code, const char *msg)
{
    struct xrun *k = arg;
    set_res(&k->res[r], code, 0, "%s", msg);
    k->open--;
}

static int state(void *arg)
{
    const struct xrun *k = arg;
    if (!k->open)
        return DPIO_DONE;
    for (size_t r = 0; r < k->n; r++)
        if (k->res[r].mono_ms && k->res[r].code != CODE_OK)
            return DPIO_FAILING;
    return DPIO_MORE;
}

#define SAME(k) ((int)COLL_IO_##k == (int)TPUEMU__COLL_KIND__COLL_##k)
_Static_assert(SAME(ALL_REDUCE) && SAME(BROADCAST) && SAME(ALL_GATHER) && SAME(REDUCE_SCATTER),
               "enum coll_kind follows CollKind");
#undef SAME

size_t coll_io_run(struct dpio_conn *conns, size_t n, uint64_t epoch, const struct coll_io_spec *cs, uint64_t seq,
                   const char *what, const struct cli_part *parts, struct cli_res *res, uint64_t deadline_ms,
                   uint64_t grace_ms, const struct cli_cancel *cancel)
{
    Tpuemu__CollSpec spec = TPUEMU__COLL_SPEC__INIT;
    static const struct dpio_ops ops = {on_header, on_frame, on_lost, state};
    struct xrun k = {conns, parts, res, calloc(n ? n : 1, 1), n, 0, seq, what};
    char label[96];
    struct dpio_run run = {&ops, &k, label, deadline_ms, grace_ms, 0, cancel};
    enum dpio_end end = DPIO_END_DONE;
    size_t failed = 0;

    spec.kind = (Tpuemu__CollKind)cs->kind;
    spec.op = (Tpuemu__ReduceOp)cs->op;
    spec.dtype = (Tpuemu__DType)cs->dtype;
    spec.algo = (Tpuemu__Algo)cs->algo;
    spec.count = cs->count;
    spec.root = cs->root;
    spec.reproducible = cs->reproducible != 0;
    spec.n_group_of_replica = cs->group_of_replica ? cs->n_group_of_replica : 0;
    spec.group_of_replica = (uint32_t *)(uintptr_t)cs->group_of_replica;
    spec.iters = cs->iters;
    spec.chunk_bytes = cs->chunk_bytes;
    memset(res, 0, n * sizeof *res);
    if (!k.x) {
        for (size_t r = 0; r < n; r++)
            set_res(&res[r], CODE_RESOURCE_EXHAUSTED, 0, "out of memory");
        return n;
    }
    snprintf(label, sizeof label, "%s #%llu", what, (unsigned long long)seq);
    for (size_t r = 0; r < n; r++) {
        Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
        struct dpio_seg in = {parts[r].in, parts[r].in_len};
        int rc;
        h.kind = KIND(COLL);
        h.epoch = epoch;
        h.seq = seq;
        h.replica = (int32_t)r;
        h.dtype = (uint32_t)spec.dtype;
        h.coll = &spec;
        conns[r].reading = 0;
        rc = dpio_send(&conns[r], &h, &in, 1);
        if (rc == CODE_INVALID_ARGUMENT) {
            set_res(&res[r], CODE_INVALID_ARGUMENT, 0,
                    "the collective's description does not fit in a frame header (too many groups?)");
        } else if (rc != CODE_OK) {
            set_res(&res[r], rc, 0, "out of memory");
        } else if (conns[r].fd < 0) {
            dpio_close(&conns[r]); /* drops the frame */
            set_res(&res[r], CODE_UNAVAILABLE, 0, "core %s/%d has no data connection", conns[r].host,
                    conns[r].core);
        } else {
            conns[r].reading = 1;
            conns[r].max_payload = (uint64_t)parts[r].out_len > FRAME_MAX_PAYLOAD ? parts[r].out_len
                                                                                   : FRAME_MAX_PAYLOAD;
            k.open++;
        }
    }
    if (k.open)
        end = dpio_run(conns, n, &run);
    if (end == DPIO_END_NOMEM)
        for (size_t r = 0; r < n; r++)
            set_res(&res[r], CODE_RESOURCE_EXHAUSTED, 0, "out of memory");
    for (size_t r = 0; r < n; r++) {
        struct dpio_conn *p = &conns[r];
        if (!res[r].mono_ms) {
            if (end == DPIO_END_CANCELLED)
                set_res(&res[r], CODE_CANCELLED, 0, "%s #%llu was cancelled (tpu_cancel) before core %s/%d answered",
                        what, (unsigned long long)seq, p->host, p->core);
            else if (run.grace_used)
                set_res(&res[r], CODE_UNAVAILABLE, 0,
                        "core %s/%d did not answer %s #%llu within %llu ms after another core failed "
                        "(it hangs or is cut off)",
                        p->host, p->core, what, (unsigned long long)seq, (unsigned long long)run.grace_used);
            else
                set_res(&res[r], CODE_DEADLINE_EXCEEDED, 0, "core %s/%d did not answer %s #%llu in time",
                        p->host, p->core, what, (unsigned long long)seq);
            res[r].mono_ms = 0; /* never answered */
        }
        if (res[r].code != CODE_OK)
            failed++;
        if (!(k.x[r] & X_CLEAN))
            dpio_close(p);
        p->reading = 0;
    }
    free(k.x);
    return failed;
}
