/* peers: the worker-facing side of the transport. One object per worker that
 * lives for the whole process; ResetCore gives it the system's replicas
 * (peers_reset), the data-plane listener hands it the connections other
 * workers dial to us (peers_accept), and the collectives use the links it
 * makes (link.h: peers_link, peers_abort).
 *
 * Timeouts derive from the cluster's heartbeat settings: a link with pending
 * operations and no progress for heartbeat_ms x dead_after fails (default
 * 1000 x 3 ms). Loop thread only. */
#ifndef TPUEMU_WORKER_COLL_PEERS_H
#define TPUEMU_WORKER_COLL_PEERS_H

#include <stdint.h>

#include "link.h"
#include "status.h"
#include "tpuemu.pb-c.h"

struct worker;
struct dp_conn;

/* Largest payload of one CHUNK frame (the engine chunks larger buffers):
 * link_send/link_recv refuse larger lengths with INVALID_ARGUMENT. */
#define LINK_MAX_FRAME (64u * 1024u * 1024u)

/* Creates w->peers and, unless w->tcp_only, the shared-memory listener (its
 * abstract unix socket name is peers_shm_name). CODE_OK or an error. */
int peers_init(struct worker *w, err *e);
/* Closes every link and the listener; w->peers is freed once its handles
 * have closed (the loop must run on). */
void peers_stop(struct worker *w);

/* "" when there is no shared-memory listener (WorkerInfo.shm_name). */
const char *peers_shm_name(const peers *p);

/* ResetCore: closes every link of the old epoch (pending operations are
 * dropped WITHOUT callbacks: the engine's coll_reset, called right after,
 * forgets them; no buffer of theirs is touched after this returns), then
 * learns r's peers and timeouts. r may be a core leaving the system. */
void peers_reset(struct worker *w, const Tpuemu__ResetCore *r);

/* An accepted data-plane connection whose AUTH says it is replica r's dial
 * (AUTH.replica >= 0 and AUTH.epoch != 0). Takes it over (its callbacks), or
 * refuses it with ERROR FAILED_PRECONDITION naming the epochs. */
void peers_accept(struct worker *w, struct dp_conn *c);

/* CODE_OK, or the error collective seq already failed with here (an ABORT
 * may arrive before the client's COLL does). */
int peers_failed(const peers *p, uint64_t seq, err *e);

/* The progress timeout in ms (heartbeat_ms x dead_after). */
unsigned peers_timeout_ms(const peers *p);

#endif
