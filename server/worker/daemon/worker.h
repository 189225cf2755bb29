/* The worker's one context struct: settings, identity, the emulated core's
 * state, and the parts of the daemon (heartbeat, control, data plane). Every
 * module gets a pointer to it; there is no other global state. */
#ifndef TPUEMU_WORKER_WORKER_H
#define TPUEMU_WORKER_WORKER_H

#include <stdint.h>

#include <uv.h>

#include "addr.h"
#include "auth.h"
#include "control.h"
#include "dataplane.h"
#include "hbm.h"
#include "heartbeat.h"
#include "metrics.h"
#include "preset.h"
#include "tpuemu.pb-c.h"

#define WORKER_HOST_ID_MAX 63

struct worker {
    uv_loop_t *loop;
    auth auth;
    replay *replay;

    /* settings */
    addr resolver;            /* parsed --resolver */
    char resolver_url[300];   /* tcp://host:port */
    char listen[ADDR_HOST_MAX];
    char advertise[ADDR_HOST_MAX];
    char host_id[WORKER_HOST_ID_MAX + 1];
    const struct tpu_preset *preset;
    int tcp_only;             /* --transport tcp: no shared memory between same-host cores */

    /* identity, as the resolver sees it */
    int core;                 /* -1 until assigned */
    uint64_t incarnation;
    char control_addr[300];   /* tcp://ADV:PORT */
    char data_addr[300];      /* ADV:PORT */
    unsigned heartbeat_ms;

    /* the emulated core */
    uint64_t epoch;           /* system epoch of the last reset; 0: never */
    int replica_id;           /* -1: not part of an initialized system */
    uint32_t num_replicas;
    hbm hbm;
    /* collectives (server/worker/coll/): the links to the other replicas of this
     * epoch's system, and the engine that runs collectives on them */
    struct peers *peers;
    struct coll *coll;
    /* training (train.h): the compiled model and its request queue */
    struct train *train;
    /* the profiler's event ring (trace.h) */
    struct trace *trace;
    size_t trace_cap;
    int throttle_pct;         /* --throttle-pct: training compute runs at this % of its speed */

    struct heartbeat hb;
    struct control ctl;
    struct wmetrics metrics;  /* Prometheus counters and the HTTP server (metrics.h) */
    struct dataplane dp;
    uv_signal_t sigint, sigterm;
    int stopping;
    int exit_code;
    char sender[96];
};

/* Fills out (an initialized WorkerInfo) from w; strings point into w. */
void worker_info(struct worker *w, Tpuemu__WorkerInfo *out);
/* "worker h0/3" ("worker h0/?" before a core is assigned), for message senders. */
const char *worker_sender(struct worker *w);
/* Starts the graceful stop (idempotent); the process exits with exit_code
 * once the loop has run dry. */
void worker_stop(struct worker *w, int exit_code);

#endif
