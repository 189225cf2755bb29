/* Data plane: the worker's TCP listener. Each accepted connection is a
 * dp_conn (dpconn.h) that must pass the challenge handshake within 5 s. A
 * connection whose AUTH carries a replica and an epoch is another worker's
 * link and goes to peers (coll/peers.h); a client's COLL frames go to the
 * collectives engine, PING is echoed as PONG, anything else is refused with an
 * ERROR frame and a close. Bounds: DP_MAX_CONNS connections (links taken over
 * by peers leave the count: at most one per peer replica), FRAME_MAX_PAYLOAD
 * per COLL, DP_MAX_PING per PING, DP_MAX_PENDING queued copied bytes each. */
#ifndef TPUEMU_WORKER_DATAPLANE_H
#define TPUEMU_WORKER_DATAPLANE_H

#include <uv.h>

#include "status.h"

#define DP_MAX_CONNS 256
#define DP_MAX_PING (1024u * 1024u)
#define DP_MAX_PENDING (4u * 1024u * 1024u)
#define DP_HANDSHAKE_MS 5000u

struct worker;
struct dp_peer;

struct dataplane {
    uv_tcp_t listener;
    int started;
    int port;
    unsigned nconns;
    struct dp_peer *conns; /* every open connection, for shutdown */
};

/* Binds w->listen on a kernel-chosen port (dp.port) and starts accepting. */
int dp_start(struct worker *w, err *e);
/* Stops accepting and closes every connection. */
void dp_stop(struct worker *w);

#endif
