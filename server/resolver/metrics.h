/* The resolver's Prometheus metrics and health check, served over HTTP
 * (common/httpd.h) on --metrics-port of its listen host, on its loop. The
 * counters live here; handlers.c bumps them. Loop thread only. */
#ifndef TPUEMU_RESOLVER_METRICS_H
#define TPUEMU_RESOLVER_METRICS_H

#include "httpd.h"
#include "prom.h"
#include "status.h"

struct resolver;

struct rmetrics {
    prom_counter heartbeats;    /* heartbeat messages handled */
    prom_counter registrations; /* cores registered, new or replacing an incarnation */
    prom_counter duplicates;    /* resends answered from the duplicate-request cache */
    httpd *httpd;
};

/* Serves /metrics and /healthz on host:port; port 0: nothing to do. */
int rm_start(struct resolver *r, const char *host, int port, err *e);
void rm_stop(struct resolver *r);

#endif
