/* The profiler's request on the wire: one PROFILE frame to a core's data
 * connection (or a host's profiler port) and its PROFILE_RESULT, as plain C:
 * what the core said of itself (struct prof_info) and the events it recorded
 * (struct prof_event). The capture (profile/capture.c) keeps them on the
 * client's clock. Never installed. */
#ifndef TPUEMU_CLIENT_PROFILE_IO_H
#define TPUEMU_CLIENT_PROFILE_IO_H

#include <stddef.h>
#include <stdint.h>

#include "cancel.h"
#include "dpio.h"
#include "status.h"

/* The kinds of events a core records (TraceKind on the wire). */
enum prof_kind {
    PROF_KIND_STEP = 1, /* a training step: infeed wait excluded, all-reduce included */
    PROF_KIND_INFEED_WAIT = 2,
    PROF_KIND_OPTIMIZER = 3,
    PROF_KIND_FORWARD = 4,
    PROF_KIND_BACKWARD = 5,
    PROF_KIND_MATMUL = 6,
    PROF_KIND_ALLREDUCE = 7,
    PROF_KIND_SEND = 8,
    PROF_KIND_RECV = 9,
    PROF_KIND_EVAL = 10,
    PROF_KIND_CLIENT_INPUT = 11,
    PROF_KIND_CLIENT_INFEED = 12,
    PROF_KIND_FAULT = 13
};

/* What a core (or a host's profiler service) said of itself. */
struct prof_info {
    uint64_t now_ns;    /* its clock when it answered */
    uint64_t dropped;   /* events overwritten in its ring before being read */
    uint64_t oldest_ns; /* start of the oldest event still in the ring */
    int truncated;      /* more matched than asked for: ask again from the last one's end */
    int replica;
    char tpu_type[16];
    uint64_t hbm_used, hbm_peak, hbm_capacity;
    double peak_bf16_flops, hbm_bandwidth, ici_bandwidth; /* the real generation's, per device */
    unsigned mxu_dim;                                     /* 0: not said */
    unsigned host_cpus;                                   /* 0: not said */
    char boot_id[40];                                     /* "": not said */
    /* a host's profiler port: its host, and the resolver its cores register with */
    int host_service;
    char host_id[64];
    char resolver[256];
};

/* One recorded event, on the core's clock. */
struct prof_event {
    uint32_t kind; /* enum prof_kind */
    uint64_t t0_ns, dur_ns, step;
    uint32_t layer, op; /* MATMUL: op 0 forward, 1 weight gradient, 2 input gradient */
    uint64_t m, n, k, bytes, seq;
    uint32_t coll_step, chunk;
    int32_t peer;
    char algo[16];
};

/* Asks the core on peer (its connection open) for the events it recorded
 * from since_ns to until_ns (its clock; 0: no bound), at most max (0: the
 * information only), with sequence number seq, within io_ms, reading a
 * payload of at most max_payload bytes. *info gets what it said of itself;
 * *ev its events (malloc'd, *nev of them; NULL when none); *t_sent and
 * *t_got the client's CLOCK_MONOTONIC ns when the request went and its
 * answer came. CODE_OK, or the error naming the core (its refusal, a frame
 * not ours, a profile that does not decode, no answer in time, cancelled:
 * cancel may be NULL). */
int profile_io_ask(struct dpio_conn *peer, uint64_t seq, uint64_t since_ns, uint64_t until_ns, uint32_t max,
                   uint32_t io_ms, uint64_t max_payload, const struct cli_cancel *cancel, struct prof_info *info,
                   struct prof_event **ev, size_t *nev, int64_t *t_sent, int64_t *t_got, err *e);

#endif
