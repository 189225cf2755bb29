/* link: how a collective moves bytes to and from one peer replica, whatever
 * carries them (TCP through dp_conn, or shared memory between workers of one
 * host). The collectives are written once against this interface.
 *
 * Model: each direction is an ordered stream of chunks. A chunk is identified
 * by (seq, step, chunk): the collective's sequence number, the algorithm's step
 * and the chunk index within the step; it carries `len` bytes destined for byte
 * `offset` of the collective's buffer (the receiver checks all of it against
 * what it posted; any mismatch fails the collective as a protocol error).
 *
 * - link_send(): the payload is written straight from buf (no copy for TCP;
 *   one copy into the shared segment for shm); buf must stay untouched until
 *   cb runs. Sends complete in order.
 * - link_recv(): posts where the next matching chunk goes; its bytes are read
 *   straight into buf. Receives complete in the order posted. A chunk that
 *   arrives before its receive is posted waits in the transport (TCP: the
 *   kernel's socket buffer, reading paused; shm: the segment), never in an
 *   unbounded queue.
 * - Every posted receive has a deadline (the progress timeout, derived from
 *   the cluster's heartbeat settings: heartbeat_ms x dead_after). When it
 *   passes, or the peer's connection drops, or the peer sends ABORT, every
 *   pending operation on the link fails with UNAVAILABLE and a message that
 *   names the core, its host and the collective: "core host1/3 never sent
 *   chunk 5 of all-reduce #812".
 * Callbacks run on the loop thread, never from inside link_send/link_recv. */
#ifndef TPUEMU_WORKER_COLL_LINK_H
#define TPUEMU_WORKER_COLL_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* <unistd.h> (pulled in by <uv.h>) declares a function link(): a file that
 * includes both defines TPUEMU_LINK_NO_TYPEDEF first and writes struct link. */
struct link;
#ifndef TPUEMU_LINK_NO_TYPEDEF
typedef struct link link;
#endif
typedef struct peers peers;

/* status CODE_OK, or the failure (e says what, for the user). */
typedef void (*link_cb)(void *arg, const err *e);

/* Identifies a chunk on the wire and in error messages. */
struct link_chunk {
    uint64_t seq;        /* collective sequence number (client-assigned, same on every core) */
    uint32_t step;       /* algorithm step */
    uint32_t chunk;      /* chunk index within the step */
    uint64_t offset;     /* byte offset in the collective's buffer (checked by the receiver) */
    const char *what;    /* "all-reduce", "broadcast", ... for messages; static string */
};

int link_send(struct link *l, const struct link_chunk *c, const void *buf, size_t len, link_cb cb, void *arg);
int link_recv(struct link *l, const struct link_chunk *c, void *buf, size_t len, link_cb cb, void *arg);

/* "host1/3" of the peer, and its replica id. */
const char *link_peer_name(const struct link *l);
int link_peer_replica(const struct link *l);
/* 1 when this link runs over shared memory. */
int link_is_shm(const struct link *l);

/* ---- the set of links of one worker, for the current system epoch ---- */

/* The link to replica r (r != own replica), made on first use: the outgoing
 * half dials r's data port (or sets up shm with a same-host peer), the incoming
 * half is r's own dial to us, accepted by the data-plane listener. NULL with e
 * set if r is not in the system. */
struct link *peers_link(peers *p, int replica, err *e);

/* Fails every pending operation of collective seq on every link with e, and
 * tells every connected peer (ABORT frames) so they fail fast with the same
 * root cause. */
void peers_abort(peers *p, uint64_t seq, const err *e);

#endif
