/* trace: what one emulated core did and when, kept in a bounded ring for the
 * profiler (tpuctl profile, the client's profiler callback).
 *
 * Recording is on by default (--trace-events N, 0 turns it off): each event
 * is one fixed-size record written by the loop thread; the thread pool's work
 * (forward, backward, matmuls) is recorded into the step's own buffer first
 * and added when the step comes back to the loop, so the ring needs no lock.
 * When the ring is full the oldest events are overwritten and counted as
 * dropped. Times are uv_hrtime() (CLOCK_MONOTONIC, ns). */
#ifndef TPUEMU_WORKER_TRACE_H
#define TPUEMU_WORKER_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "tpuemu.pb-c.h"

#define TRACE_DEFAULT_EVENTS 65536u
#define TRACE_MAX_EVENTS (1u << 22)
/* events of one fetch: a frame's payload stays well under its limit */
#define TRACE_MAX_FETCH 65536u

struct trace_ev {
    uint64_t t0, dur, step, m, n, k, bytes, seq;
    uint32_t kind;     /* TPUEMU__TRACE_KIND__* */
    uint32_t layer, op, coll_step, chunk;
    int32_t peer;
    char algo[16];
};

typedef struct trace trace;

/* A ring of cap events (0: recording off, trace_add does nothing). NULL when
 * out of memory. */
trace *trace_new(size_t cap);
/* Touches every page of the ring once (6.5 MiB at the default 65,536
 * events), so its share of the worker's memory is there at once rather than
 * taken page by page over the first quarter hour of training. The worker
 * calls it at its first initialize: a core that never trains (an idle pod of
 * 1,024 emulated cores) does not pay for it. */
void trace_make_resident(trace *t);
void trace_free(trace *t);
void trace_add(trace *t, const struct trace_ev *ev);
/* A complete event of kind from t0 to now... convenience for the loop. */
void trace_span(trace *t, uint32_t kind, uint64_t t0, uint64_t t1, uint64_t step);

size_t trace_capacity(const trace *t);
uint64_t trace_recorded(const trace *t);
uint64_t trace_dropped(const trace *t);
uint64_t trace_oldest(const trace *t);

/* Serializes into out (a TraceEvents payload, malloc'd) the events, oldest
 * first, that end at or after since and start before until, at most max of
 * them; *truncated when more matched. Events still in the ring are not
 * consumed: several readers may ask. CODE_OK or CODE_RESOURCE_EXHAUSTED. */
int trace_fetch(const trace *t, uint64_t since, uint64_t until, uint32_t max, uint8_t **out, size_t *out_len,
                int *truncated);

#endif
