/* The worker's one context struct: settings, the emulated core (identity,
 * HBM, the profiler's ring), the layers below the daemon (peers, the
 * collectives engine, the training service), and the parts of the daemon
 * (heartbeat, control, data plane, metrics). Only main.c knows it: it hands
 * every part what that part needs (an env struct of pointers and callbacks),
 * and no part keeps a pointer to the worker. There is no other global state. */
#ifndef TPUEMU_WORKER_DAEMON_WORKER_H
#define TPUEMU_WORKER_DAEMON_WORKER_H

#include <stdint.h>

#include <uv.h>

#include "addr.h"
#include "auth.h"
#include "coll.h"
#include "control.h"
#include "dataplane.h"
#include "hbm.h"
#include "heartbeat.h"
#include "ident.h"
#include "fault.h"
#include "metrics.h"
#include "notice.h"
#include "peers.h"
#include "preset.h"
#include "trace.h"
#include "train.h"

struct worker {
    uv_loop_t *loop;
    auth auth;
    replay *replay;

    /* settings */
    addr resolver;            /* parsed --resolver */
    char resolver_url[300];   /* tcp://host:port */
    char listen[ADDR_HOST_MAX];
    char advertise[ADDR_HOST_MAX];
    const struct tpu_preset *preset;
    char accelerator_type[32]; /* --accelerator-type: the slice ("v4-16"), "" for none */
    int tcp_only;             /* --transport tcp: no shared memory between same-host cores */
    int metrics_port;         /* --metrics-port; 0: off */
    int profiler_port;        /* --profiler-port: the host's profiler port, served by its core 0; 0: off */
    size_t trace_cap;
    int throttle_pct;         /* --throttle-pct: training compute runs at this % of its speed */

    /* the emulated core: who it is (as the resolver sees it), its HBM, its
     * profiler's ring (core/) */
    struct core_ident id;
    char control_addr[300];   /* tcp://ADV:PORT */
    char data_addr[300];      /* ADV:PORT, or --advertise-data */
    int data_port;            /* --data-port; 0: the kernel's choice */
    hbm hbm;
    struct trace *trace;
    struct notice notice;     /* what is coming to it: preemption, maintenance (fault.h) */
    Tpuemu__Notice notice_pb; /* its wire form, for the heartbeat */

    /* the layers below the daemon, bottom up: the links to the other
     * replicas of this epoch's system (net/), the engine that runs
     * collectives on them (coll/), the compiled model and its request queue
     * (train/); and the counters the last two keep */
    struct peers *peers;
    struct coll *coll;
    struct train *train;
    struct coll_stats coll_stats;
    struct train_stats train_stats;

    /* the daemon's parts */
    struct heartbeat hb;
    struct control ctl;
    struct wmetrics metrics;  /* Prometheus counters and the HTTP server (metrics.h) */
    struct dataplane dp;
    struct dataplane prof;    /* the host's profiler port, when this is its core 0 (dataplane.h) */
    int prof_tried;           /* bound it, or tried and logged why not */
    char resolver_hp[300];    /* the resolver as HOST:PORT, told on the profiler port */
    struct fault fault;       /* injected faults (fault.h) */
    uv_signal_t sigint, sigterm;
    uv_timer_t trim; /* the heap's free pages given back, once it has had a system (memtrim.h) */
    uint64_t trim_ms;
    int stopping;
    int exit_code;
};

#endif
