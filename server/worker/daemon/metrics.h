/* The worker's Prometheus metrics and health check, served over HTTP
 * (common/httpd.h) on --metrics-port of its --listen address, on its loop.
 * The counters live here and are bumped where the work is done (train.c,
 * coll/coll.c, heartbeat.c) with relaxed atomic adds: no lock, no call. */
#ifndef TPUEMU_WORKER_METRICS_H
#define TPUEMU_WORKER_METRICS_H

#include "httpd.h"
#include "prom.h"
#include "status.h"

struct worker;

#define WM_COLL_KINDS 5 /* CollKind 1..4 (all-reduce, broadcast, all-gather, reduce-scatter) */

struct wmetrics {
    prom_counter steps;            /* training steps done (gradients all-reduced) */
    prom_hist step_seconds;        /* each one's time: compute, all-reduce, the update before it */
    prom_counter allreduce_bytes;  /* input bytes of every all-reduce done, per iteration */
    prom_counter coll[WM_COLL_KINDS];
    prom_counter coll_failed;
    prom_counter heartbeats_sent, heartbeats_acked;
    httpd *httpd;
    int port;                      /* --metrics-port; 0: off */
};

/* Before anything counts (main). */
void wm_init(struct worker *w, int port);
/* Serves /metrics and /healthz on w->listen:port unless port is 0. */
int wm_start(struct worker *w, err *e);
void wm_stop(struct worker *w);

/* A collective finished on this core: kind (CollKind), ok, and for an
 * all-reduce the bytes of this replica's input times the iterations. */
static inline void wm_coll_done(struct wmetrics *m, int kind, int ok, uint64_t allreduce_bytes)
{
    if (!ok) {
        prom_add(&m->coll_failed, 1);
        return;
    }
    prom_add(&m->coll[kind > 0 && kind < WM_COLL_KINDS ? kind : 0], 1);
    if (allreduce_bytes)
        prom_add(&m->allreduce_bytes, allreduce_bytes);
}

#endif
