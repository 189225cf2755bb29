/* The worker's Prometheus metrics and health check, served over HTTP
 * (common/http/httpd.h) on --metrics-port of its --listen address, on its loop.
 * The counters live with the parts that count (coll_stats, train_stats, the
 * heartbeat's), bumped where the work is done with relaxed atomic adds: no
 * lock, no call; a scrape reads them here. */
#ifndef TPUEMU_WORKER_METRICS_H
#define TPUEMU_WORKER_METRICS_H

#include <uv.h>

#include "coll.h"
#include "control.h"
#include "dataplane.h"
#include "fault.h"
#include "hbm.h"
#include "heartbeat.h"
#include "httpd.h"
#include "ident.h"
#include "prom.h"
#include "status.h"
#include "train.h"

/* What a scrape reads; every pointer must outlive the server. */
struct wm_env {
    uv_loop_t *loop;
    const char *listen;              /* local address to bind */
    const char *resolver_url;        /* for /healthz's reasons */
    const struct core_ident *id;
    const hbm *hbm;
    /* read only; not const because a relaxed atomic load takes a plain pointer */
    struct coll_stats *coll;
    struct train_stats *train;
    struct heartbeat *hb;            /* counters, and registered or not */
    const struct control *ctl;       /* listening or not */
    const struct dataplane *dp;
    struct fault *fault;             /* counters of injected faults */
    const int *stopping;
};

struct wmetrics {
    struct wm_env env;
    httpd *httpd;
    int port;                      /* --metrics-port; 0: off */
};

/* Serves /metrics, /healthz (alive: the loop answers, the ports listen) and
 * /readyz (alive and registered with the resolver) on env->listen:port unless
 * port is 0. */
int wm_start(struct wmetrics *m, const struct wm_env *env, int port, err *e);
void wm_stop(struct wmetrics *m);

#endif
