/* xport: the transport the collectives engine runs on, as an ops table. The
 * engine (coll/) is written once against it; the worker's peers (peers.h)
 * implement it over TCP and shared memory, and a unit test can implement it
 * in memory. Nothing here knows which.
 *
 * Model: to each peer replica there is one channel; each direction is an
 * ordered stream of chunks. A chunk is identified by (seq, step, chunk): the
 * collective's sequence number, the algorithm's step and the chunk index
 * within the step; it carries `len` bytes destined for byte `offset` of the
 * collective's buffer (the receiver checks all of it against what it posted;
 * any mismatch fails the collective as a protocol error).
 *
 * - send: the payload is taken straight from buf (or copied once into a
 *   shared segment); buf must stay untouched until cb runs. Sends complete in
 *   order.
 * - recv: posts where the next matching chunk goes; its bytes land straight
 *   in buf. Receives complete in the order posted. A chunk that arrives before
 *   its receive is posted waits in the transport, never in an unbounded queue.
 * - A transport fails pending operations with UNAVAILABLE and a message that
 *   names the core, its host and the collective ("core host1/3 never sent
 *   chunk 5 of all-reduce #812") when a peer dies, hangs or aborts.
 * - abort(seq, e): fails every pending operation of collective seq with e,
 *   and tells every peer so they fail fast with the same root cause.
 * - failed(seq, e): CODE_OK, or the error collective seq already failed with
 *   (an abort may arrive before this core starts the collective).
 * Callbacks run on the loop thread, never from inside send or recv. */
#ifndef TPUEMU_WORKER_NET_XPORT_H
#define TPUEMU_WORKER_NET_XPORT_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Largest payload of one chunk (the engine chunks larger buffers): send and
 * recv refuse larger lengths with INVALID_ARGUMENT. */
#define XPORT_MAX_CHUNK (64u * 1024u * 1024u)

/* status CODE_OK, or the failure (e says what, for the user). */
typedef void (*xport_cb)(void *arg, const err *e);
/* recv_reduce: combines len bytes that arrived (src, valid only during the
 * call) into dst, a part of the receive's destination; called once per piece
 * in order, the pieces tiling the chunk. Element-wise kernels only. */
typedef void (*xport_reduce_fn)(void *arg, uint8_t *dst, const uint8_t *src, size_t len);

/* Identifies a chunk on the wire and in error messages. */
struct xport_chunk {
    uint64_t seq;        /* collective sequence number (client-assigned, same on every core) */
    uint32_t step;       /* algorithm step */
    uint32_t chunk;      /* chunk index within the step */
    uint64_t offset;     /* byte offset in the collective's buffer (checked by the receiver) */
    const char *what;    /* "all-reduce", "broadcast", ... for messages; static string */
};

/* A channel to one peer replica, as the transport made it; opaque here. */
struct xport_chan;

struct xport_ops {
    /* The channel to replica r (not this core's own), made on first use; NULL
     * with e set when r is not a peer or this core is in no system. */
    struct xport_chan *(*chan)(void *self, int replica, err *e);
    /* CODE_OK (cb follows exactly once), or CODE_INVALID_ARGUMENT /
     * CODE_RESOURCE_EXHAUSTED and cb never runs. */
    int (*send)(struct xport_chan *ch, const struct xport_chunk *c, const void *buf, size_t len, xport_cb cb,
                void *arg);
    int (*recv)(struct xport_chan *ch, const struct xport_chunk *c, void *buf, size_t len, xport_cb cb,
                void *arg);
    /* "host1/3" of the channel's peer: host id, '/', core. */
    const char *(*peer_name)(const struct xport_chan *ch);
    /* 1 when the channel runs over shared memory (for "ring+shm"). */
    int (*is_shm)(const struct xport_chan *ch);
    void (*abort)(void *self, uint64_t seq, const err *e);
    int (*failed)(const void *self, uint64_t seq, err *e);
    /* Optional (NULL: not offered). fuse: 1 when recv_reduce of len bytes
     * from replica r is worth it (shared memory: the bytes are reduced
     * straight from the ring instead of copied out first, and the chunk fits
     * in the ring, so posting it only once the reduce may run cannot stall
     * the sender for good). recv_reduce: recv, except that the bytes are
     * combined into buf by red(red_arg, ...) as they arrive; same contract
     * otherwise (it works over any link, only slower where fuse said 0). */
    int (*fuse)(void *self, int replica, size_t len);
    int (*recv_reduce)(struct xport_chan *ch, const struct xport_chunk *c, void *buf, size_t len,
                       xport_reduce_fn red, void *red_arg, xport_cb cb, void *arg);
    /* The host of replica r (this core's own too) as a number, equal for two
     * replicas exactly when they run on one host; -1 when r is not a replica
     * of the system. Makes no channel: the hierarchical schedule asks it of
     * every replica. */
    int (*host)(void *self, int replica);
    /* Optional (NULL: not offered). The host segment of replica r: this
     * core's own (writable; r = this core), or a same-host peer's as mapped
     * here (read-only: never write through it), for the direct intra-host
     * all-reduce (coll/direct.c); *len its bytes. NULL when there is none
     * (no shared memory, or the peer's has not come with its link yet). A
     * segment stays mapped until the transport is reset (peers_reset), even
     * after its peer died. */
    uint8_t *(*seg)(void *self, int replica, size_t *len);
};

/* A transport: its ops and the object they work on. */
struct xport {
    const struct xport_ops *ops;
    void *self;
};

#endif
