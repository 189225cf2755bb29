/* peers: the worker-facing side of the transport. One object per worker that
 * lives for the whole process; ResetCore gives it the system's replicas
 * (peers_reset), the data-plane listener hands it the connections other
 * workers dial to us (peers_accept), and the collectives engine uses the
 * channels it makes through the transport ops table (peers_xport, xport.h).
 *
 * Timeouts derive from the cluster's heartbeat settings: a channel with
 * pending operations and no progress for heartbeat_ms x dead_after fails
 * (default 1000 x 3 ms). Loop thread only. */
#ifndef TPUEMU_WORKER_NET_PEERS_H
#define TPUEMU_WORKER_NET_PEERS_H

#include <stdint.h>

#include <uv.h>

#include "auth.h"
#include "dpconn.h"
#include "ident.h"
#include "status.h"
#include "tpuemu.pb-c.h"
#include "trace.h"
#include "xport.h"

struct peers;

/* What peers needs from its owner; every pointer must outlive the peers. */
struct peers_env {
    uv_loop_t *loop;
    const auth *auth;            /* cluster key: TCP handshakes, shared-memory hellos, probes */
    const struct core_ident *id; /* this core: names in messages, the shm socket's incarnation */
    struct trace *trace;         /* the profiler's ring: a SEND/RECV event per chunk */
    int tcp_only;                /* --transport tcp: no shared memory between same-host cores */
};

/* Creates the peers and, unless env->tcp_only, the shared-memory listener
 * (its abstract unix socket name is peers_shm_name; when it cannot listen a
 * warning is logged and TCP serves alone). CODE_OK or an error. */
int peers_new(const struct peers_env *env, struct peers **out, err *e);
/* Closes every channel and the listener; no callback runs after this, and
 * the transport fails every operation as a core in no system would. Handles
 * close from the loop: free with peers_free once it has run dry. */
void peers_stop(struct peers *p);
void peers_free(struct peers *p);

/* The transport ops table over these peers, for the collectives engine. */
struct xport peers_xport(struct peers *p);

/* "" when there is no shared-memory listener (WorkerInfo.shm_name). */
const char *peers_shm_name(const struct peers *p);

/* ResetCore: closes every channel of the old epoch (pending operations are
 * dropped WITHOUT callbacks: the engine's coll_reset, called right after,
 * forgets them; no buffer of theirs is touched after this returns), then
 * learns r's peers and timeouts. r may be a core leaving the system. */
void peers_reset(struct peers *p, const Tpuemu__ResetCore *r);

/* An accepted data-plane connection whose AUTH says it is replica r's dial
 * (AUTH.replica >= 0 and AUTH.epoch != 0). Takes it over (its callbacks), or
 * refuses it with ERROR FAILED_PRECONDITION naming the epochs. */
void peers_accept(struct peers *p, dp_conn *c);

#endif
