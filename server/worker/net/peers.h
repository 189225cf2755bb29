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

/* Link faults (tpuctl chaos link-delay, link-loss, partition): what this core
 * sends to one peer core, named by host and core, is held back from now for
 * duration_ms. kind is TPUEMU__FAULT_KIND__FAULT_LINK_DELAY (each chunk held
 * latency_ms), _LINK_LOSS (each transmission of a chunk lost with probability
 * percent %, drawn from seed and the link's ends, and sent again after a
 * timeout of 200 ms doubling up to 3.2 s: a delay, as TCP shows a loss) or
 * _PARTITION (nothing passes until the end; a collective that waits on the
 * link past the silence timeout fails naming both cores). Chunks stay in
 * order; a fault on a link replaces the one before; it outlives a reset.
 * peers_link_check: CODE_OK, INVALID_ARGUMENT when host/core is this core,
 * NOT_FOUND when this core is in a system and host/core is not in it. */
int peers_link_check(const struct peers *p, const char *host, int core, err *e);
/* Checks as peers_link_check, then starts the fault: CODE_OK, or the error
 * (also RESOURCE_EXHAUSTED: faults on 16 links already) with nothing changed. */
int peers_link_fault(struct peers *p, int kind, const char *host, int core, uint32_t latency_ms, uint32_t percent,
                     uint32_t duration_ms, uint32_t seed, err *e);

/* Replica r of the current system: its data-plane address ("10.0.0.2:8471")
 * into addr and its name ("h1/3") into name. CODE_OK, or CODE_NOT_FOUND
 * when this core is in no system or r is not in it. */
int peers_replica_addr(const struct peers *p, uint32_t r, char *addr, size_t acap, char *name, size_t ncap);

/* An accepted data-plane connection whose AUTH says it is replica r's dial
 * (AUTH.replica >= 0 and AUTH.epoch != 0). Takes it over (its callbacks), or
 * refuses it with ERROR FAILED_PRECONDITION naming the epochs. */
void peers_accept(struct peers *p, dp_conn *c);

#endif
