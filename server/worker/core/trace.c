/* The core's event ring (trace.h). */
#include "trace.h"

#include <stdlib.h>
#include <string.h>

#include "memtrim.h"
#include "status.h"

struct trace {
    struct trace_ev *ev;
    size_t cap;
    uint64_t head; /* events ever added; the newest is (head - 1) % cap */
    int resident;  /* trace_make_resident touched every page */
};

trace *trace_new(size_t cap)
{
    trace *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    if (cap > TRACE_MAX_EVENTS)
        cap = TRACE_MAX_EVENTS;
    if (cap && !(t->ev = malloc(cap * sizeof *t->ev))) {
        free(t);
        return NULL;
    }
    t->cap = cap;
    return t;
}

void trace_make_resident(trace *t)
{
    if (t && t->cap && !t->resident) {
        mem_resident(t->ev, t->cap * sizeof *t->ev);
        t->resident = 1;
    }
}

void trace_free(trace *t)
{
    if (!t)
        return;
    free(t->ev);
    free(t);
}

void trace_add(trace *t, const struct trace_ev *ev)
{
    if (!t || !t->cap)
        return;
    t->ev[t->head % t->cap] = *ev;
    t->head++;
}

void trace_span(trace *t, uint32_t kind, uint64_t t0, uint64_t t1, uint64_t step)
{
    struct trace_ev ev;
    if (!t || !t->cap)
        return;
    memset(&ev, 0, sizeof ev);
    ev.kind = kind;
    ev.t0 = t0;
    ev.dur = t1 > t0 ? t1 - t0 : 0;
    ev.step = step;
    trace_add(t, &ev);
}

size_t trace_capacity(const trace *t)
{
    return t ? t->cap : 0;
}

uint64_t trace_recorded(const trace *t)
{
    return t ? t->head : 0;
}

uint64_t trace_dropped(const trace *t)
{
    return t && t->head > t->cap ? t->head - t->cap : 0;
}

uint64_t trace_oldest(const trace *t)
{
    if (!t || !t->head)
        return 0;
    uint64_t first = t->head > t->cap ? t->head - t->cap : 0;
    return t->ev[first % t->cap].t0;
}

int trace_fetch(const trace *t, uint64_t since, uint64_t until, uint32_t max, uint8_t **out, size_t *out_len,
                int *truncated)
{
    Tpuemu__TraceEvents te = TPUEMU__TRACE_EVENTS__INIT;
    Tpuemu__TraceEvent *evs = NULL, **ptrs = NULL;
    uint64_t first = t && t->head > t->cap ? t->head - t->cap : 0;
    size_t n = 0;
    int rc = CODE_OK;

    *out = NULL;
    *out_len = 0;
    *truncated = 0;
    if (max > TRACE_MAX_FETCH)
        max = TRACE_MAX_FETCH;
    if (t && t->cap && max) {
        size_t want = 0; /* what matches, so a small answer allocates little */
        for (uint64_t i = first; i < t->head && want <= max; i++) {
            const struct trace_ev *e = &t->ev[i % t->cap];
            want += !(e->t0 + e->dur < since || (until && e->t0 >= until));
        }
        if (want > max)
            want = max;
        evs = calloc(want + 1, sizeof *evs);
        ptrs = calloc(want + 1, sizeof *ptrs);
        if (!evs || !ptrs) {
            rc = CODE_RESOURCE_EXHAUSTED;
            goto done;
        }
        for (uint64_t i = first; i < t->head; i++) {
            const struct trace_ev *e = &t->ev[i % t->cap];
            if (e->t0 + e->dur < since || (until && e->t0 >= until))
                continue;
            if (n == want) {
                *truncated = 1;
                break;
            }
            Tpuemu__TraceEvent *p = &evs[n];
            tpuemu__trace_event__init(p);
            p->kind = (Tpuemu__TraceKind)e->kind;
            p->t0_ns = e->t0;
            p->dur_ns = e->dur;
            p->step = e->step;
            p->layer = e->layer;
            p->op = e->op;
            p->m = e->m;
            p->n = e->n;
            p->k = e->k;
            p->bytes = e->bytes;
            p->seq = e->seq;
            p->coll_step = e->coll_step;
            p->chunk = e->chunk;
            p->peer = e->peer;
            p->algo = (char *)e->algo;
            ptrs[n++] = p;
        }
    }
    te.n_events = n;
    te.events = ptrs;
    *out_len = tpuemu__trace_events__get_packed_size(&te);
    if (!(*out = malloc(*out_len + 1))) {
        *out_len = 0;
        rc = CODE_RESOURCE_EXHAUSTED;
        goto done;
    }
    tpuemu__trace_events__pack(&te, *out);
done:
    free(evs);
    free(ptrs);
    return rc;
}
