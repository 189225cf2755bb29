/* The resolver's Prometheus metrics and health check, served over HTTP
 * (common/http/httpd.h) on --metrics-port of its listen host, on its loop. The
 * counters live here; handlers.c bumps them. Loop thread only. */
#ifndef TPUEMU_RESOLVER_METRICS_H
#define TPUEMU_RESOLVER_METRICS_H

#include "httpd.h"
#include "prom.h"
#include "status.h"

struct resolver;

/* Why a core was forgotten (tpuemu_resolver_cores_forgotten_total{reason}). */
enum forget_reason {
    FORGET_LEFT,     /* its worker stopped cleanly and said so (Leave) */
    FORGET_EXPIRED,  /* dead for longer than --forget-after-ms */
    FORGET_OPERATOR, /* tpuctl forget, tpu_forget_core() */
    FORGET_EVICTED,  /* --max-cores were tracked: the longest-dead made room */
    FORGET_REASONS
};

struct rmetrics {
    prom_counter heartbeats;    /* heartbeat messages handled */
    prom_counter registrations; /* cores registered, new or replacing an incarnation */
    prom_counter duplicates;    /* resends answered from the duplicate-request cache */
    prom_counter forgotten[FORGET_REASONS]; /* cores removed from the registry, by reason */
    httpd *httpd;
};

/* Serves /metrics, /healthz, /readyz and the cluster console (console.h) on
 * host:port; port 0: nothing to do. */
int rm_start(struct resolver *r, const char *host, int port, err *e);
void rm_stop(struct resolver *r);

#endif
