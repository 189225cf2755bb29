/* Prometheus text exposition (format 0.0.4) for the daemons' /metrics:
 * counters and histograms cheap enough for the hot path (relaxed atomic adds,
 * no lock, no allocation), and the writers of HELP/TYPE lines and samples.
 *
 * A daemon keeps its counters in its own context and renders them on request;
 * values read while other threads add may be a step apart from each other, but
 * a histogram's _count is always the sum of its buckets. */
#ifndef TPUEMU_COMMON_PROM_H
#define TPUEMU_COMMON_PROM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "httpd.h"

#define PROM_CONTENT_TYPE "text/plain; version=0.0.4"
#define PROM_HIST_MAX 16

typedef atomic_uint_least64_t prom_counter;

static inline void prom_add(prom_counter *c, uint64_t n)
{
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

static inline uint64_t prom_get(prom_counter *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

/* A histogram of durations with fixed upper bounds in seconds (ascending, at
 * most PROM_HIST_MAX; +Inf is implied). */
typedef struct prom_hist {
    const double *bounds;
    size_t n;
    prom_counter counts[PROM_HIST_MAX + 1]; /* per bucket, not cumulative; [n] is +Inf */
    prom_counter sum_ns;
} prom_hist;

void prom_hist_init(prom_hist *h, const double *bounds, size_t n);
void prom_hist_observe_ns(prom_hist *h, uint64_t ns);

/* "# HELP name help\n# TYPE name type\n"; type is counter, gauge or histogram. */
void prom_family(hbuf *b, const char *name, const char *type, const char *help);
/* "name{labels} value\n"; labels is `k="v",k2="v2"` (already escaped) or NULL/"". */
void prom_u64(hbuf *b, const char *name, const char *labels, uint64_t v);
void prom_i64(hbuf *b, const char *name, const char *labels, int64_t v);
/* The _bucket, _sum and _count samples of h, each with labels added. */
void prom_hist_write(hbuf *b, const char *name, const char *labels, prom_hist *h);
/* Escapes a label value (\, " and newline) into out; truncates to n. */
const char *prom_escape(const char *v, char *out, size_t n);

#endif
