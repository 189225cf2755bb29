/* Data plane: the worker's TCP listener. Each accepted connection is a
 * dp_conn (dpconn.h) that must pass the challenge handshake within 5 s. A
 * connection whose AUTH carries a replica and an epoch is another worker's
 * link and goes to peers (net/peers.h); a client's COLL frames go to the
 * collectives engine, PING is echoed as PONG, anything else is refused with an
 * ERROR frame and a close. Bounds: DP_MAX_UNAUTH connections still in their
 * handshake (a new one evicts the oldest of them: strangers cannot hold the
 * port), DP_MAX_CONNS authenticated clients beside them (links taken over by
 * peers leave both counts: at most one per peer replica), FRAME_MAX_PAYLOAD
 * per COLL, DP_MAX_PING per PING, DP_MAX_PENDING queued copied bytes each.
 * The same listener, with profiler_only, serves the host's profiler port. */
#ifndef TPUEMU_WORKER_DATAPLANE_H
#define TPUEMU_WORKER_DATAPLANE_H

#include <uv.h>

#include "auth.h"
#include "coll.h"
#include "hbm.h"
#include "log.h"
#include "ident.h"
#include "peers.h"
#include "preset.h"
#include "status.h"
#include "trace.h"
#include "train.h"

#define DP_MAX_CONNS 256  /* authenticated client connections */
#define DP_MAX_UNAUTH 64  /* connections still in their handshake */
#define DP_MAX_PING (1024u * 1024u)
#define DP_HANDSHAKE_MS 5000u
/* With DP_MAX_CONNS clients connected, a new one takes the place of the one
 * silent longest, if it has been silent this long (a profiler client asks
 * every 200 ms while it captures; a training client at every step) */
#define DP_CLIENT_IDLE_MS 30000u
#define DP_PROFILER_IDLE_MS 2000u

struct dp_peer;

/* What the listener needs from its owner; every pointer must outlive it. The
 * parts frames go to (peers, coll, train) and the PROFILE answer's sources
 * may be set after dp_start, but before the loop runs. */
struct dp_env {
    uv_loop_t *loop;
    const auth *auth;
    const char *listen;              /* local address to bind */
    int port;                        /* port to bind; 0: the kernel picks */
    const struct core_ident *id;     /* sender in handshakes; PROFILE answers */
    const int *stopping;             /* nonzero: refuse new connections */
    struct peers *peers;             /* other workers' dials */
    struct coll *coll;               /* COLL frames */
    struct train *train;             /* COMPILE, STEPS, STATE_GET, STATE_SET */
    struct trace *trace;             /* PROFILE: the events */
    const hbm *hbm;                  /* PROFILE: the core's HBM */
    const struct tpu_preset *preset; /* PROFILE: the generation's peaks */
    /* The host's profiler port (tpu-worker --profiler-port): a listener that
     * answers PROFILE only, naming the resolver, and refuses every other
     * frame and other workers' links. */
    int profiler_only;
    const char *resolver_addr;       /* PROFILE on the profiler port: HOST:PORT */
};

struct dataplane {
    struct dp_env env;
    uv_tcp_t listener;
    int started;
    int port;
    unsigned nauth;          /* authenticated client connections */
    unsigned nunauth;        /* connections still in their handshake (not evicted) */
    unsigned long long next_seq;
    unsigned long long evicted; /* handshakes evicted by newer connections */
    struct dp_peer *conns;   /* every open connection, for shutdown */
};

/* Binds env->listen on env->port (0: one the kernel picks; dp->port says which)
 * and starts accepting. */
int dp_start(struct dataplane *dp, const struct dp_env *env, err *e);
/* Stops accepting and closes every connection. */
void dp_stop(struct dataplane *dp);

#endif
