/* Collectives inside libtpuclient: the state a cluster handle keeps for them
 * (the system's cores, one data connection per core, the last call's
 * outcome) and the poll()-driven exchange that sends every replica's input and
 * reads every core's result at once. Never installed. */
#ifndef TPUEMU_CLIENT_COLL_H
#define TPUEMU_CLIENT_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"

#define COLL_HOST_MAX 64
#define COLL_ALGO_MAX 32
#define COLL_CONNECT_MS 5000u
/* Progress timeout when the cluster spec cannot tell (1000 ms x 3). */
#define COLL_DEFAULT_PROGRESS_MS 3000u

struct cli_peer {
    char host[COLL_HOST_MAX];
    int core;
    char addr[ADDR_HOST_MAX + 16]; /* "ADDR:PORT" */
    int fd;                        /* -1: not connected */
};

/* One replica's outcome of the last call. */
struct cli_res {
    int code;                 /* CODE_* */
    char msg[ERR_MSG_MAX];
    int from_core;            /* 1: the core said so (COLL_RESULT/ERROR); 0: seen by the client */
    uint64_t mono_ms;         /* when it came; 0: never */
    uint64_t ns;              /* the core's time per iteration */
    char algo[COLL_ALGO_MAX]; /* the core's algo_used */
};

struct cli_coll {
    uint64_t epoch;
    size_t n;
    struct cli_peer *peers; /* n, replica order */
    struct cli_res *res;    /* n */
    uint64_t next_seq;
    uint32_t progress_ms;   /* heartbeat_ms x dead_after; 0: not asked yet */
    tpu_collective_stats last;
    struct tio_stream *tio; /* training requests in flight, per replica (train_io.h) */
};

/* What one replica sends and receives in a call. in may be NULL when in_len
 * is 0; out receives exactly out_len bytes. in and out may be the same buffer
 * (in place): the result is read only after the whole input was written. */
struct cli_part {
    const void *in;
    size_t in_len;
    void *out;
    size_t out_len;
};

/* Connects p (p->fd was -1) and authenticates, within the deadline. */
int coll_io_dial(tpu_cluster *c, struct cli_peer *p, uint64_t deadline_ms, err *e);
/* Connects (and authenticates) every core that has no connection yet. */
int coll_io_connect(tpu_cluster *c, uint64_t deadline_ms, err *e);

/* Sends FRAME_COLL{seq, epoch, spec} + parts[r].in to every core r and reads
 * each FRAME_COLL_RESULT into parts[r].out, all sockets at once, until every
 * core answered or failed, or deadline_ms (CLOCK_MONOTONIC ms) passed. Once
 * one replica failed, the others get at most grace_ms more. Fills
 * c->coll->res; returns how many replicas failed. Connections that did not
 * end cleanly are closed. what: "all-reduce", ... for messages. */
size_t coll_io_run(tpu_cluster *c, const Tpuemu__CollSpec *spec, uint64_t seq, const char *what,
                   const struct cli_part *parts, uint64_t deadline_ms, uint64_t grace_ms);

void coll_io_close(struct cli_peer *p);

/* heartbeat_ms x dead_after of the cluster (asked once): how long a dead core
 * may go unnoticed. */
uint64_t cli_coll_progress_ms(tpu_cluster *c);

#endif
