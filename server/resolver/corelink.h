/* corelink: the resolver's control connection to one worker (an spreq: one
 * TCP connection to its control_addr speaking nanomsg's REQ protocol).
 *
 * One call is on the wire at a time; a few more may queue behind it (each
 * keeps its own deadline, checked when its turn comes). A reply is matched to
 * the call by the request nonce; late or foreign replies are dropped. Every
 * call completes exactly once through its callback: with the worker's
 * CoreReport, an error reply, a deadline, or CANCELLED when the link closes.
 * Cancellations are delivered from the close callback, never from inside
 * corelink_close(), so callers may close a link from anywhere. A call whose
 * connection breaks (or cannot be made) is sent again, sealed anew, after
 * CORELINK_RETRY_MS, doubling with each loss (at most 16 x), until its
 * deadline, whose error then says what failed. */
#ifndef TPUEMU_RESOLVER_CORELINK_H
#define TPUEMU_RESOLVER_CORELINK_H

#include <stdint.h>

#include <uv.h>

#include "auth.h"
#include "peertab.h"
#include "spreq.h"
#include "tpuemu.pb-c.h"

#define CORELINK_QUEUE 4
#define CORELINK_RETRY_MS 200
/* A kept link (corelink_keep_open) is probed when it has been idle this long,
 * plus up to CORELINK_KEEPALIVE_JITTER_MS (fixed per link, so the links made
 * in one registration storm do not all probe at once): well inside the 120 s
 * after which a worker closes a silent control connection (CTL_IDLE_MS). */
#define CORELINK_KEEPALIVE_MS 50000u
#define CORELINK_KEEPALIVE_JITTER_MS 20000u
#define CORELINK_KEEPALIVE_TIMEOUT_MS 5000u

/* code CODE_OK: w is the worker's report (valid during the call only).
 * Otherwise msg says what went wrong and w is NULL. */
typedef void (*corelink_cb)(void *ctx, uint64_t tag, int idx, int code, const char *msg,
                            const Tpuemu__WorkerInfo *w);

/* ResetCore.peer_table (packed once) and the timeout settings, shared by the
 * reset calls of one initialize: refcounted, each queued call holds a
 * reference until it is popped. */
struct cl_peers {
    int refs;
    uint32_t heartbeat_ms, dead_after;
    uint32_t machine_cores, machine_cpus; /* why dead_after is what it is */
    size_t n;
    uint8_t *table; /* a serialized PeerTable of n cores (peertab.h) */
    size_t table_len;
    int keep_faults; /* ResetCore.keep_scheduled_faults */
};
/* The table of rows[0..n) with one reference; NULL with e set when a row
 * does not fit the table or memory ran out. */
struct cl_peers *cl_peers_new(const struct peertab_row *rows, size_t n, uint32_t heartbeat_ms,
                              uint32_t dead_after, err *e);
void cl_peers_unref(struct cl_peers *p);

struct cl_call {
    int is_probe;            /* ProbeCore, else ResetCore with the fields below */
    uint64_t epoch;
    int32_t replica_id;
    uint32_t num_replicas;
    struct cl_peers *peers;  /* a reference, or NULL (a core leaving the system) */
    uint64_t deadline_ms;    /* monotonic */
    corelink_cb cb;
    uint64_t tag;
    int idx;
};

typedef struct corelink {
    spreq *rq;               /* the connection */
    uv_loop_t *loop;
    int closing;
    uv_timer_t timer;
    const auth *auth;
    void *ctx;               /* passed to callbacks */
    char url[256];
    /* the one process every call is for (Message.recipient) */
    char host[64];
    int core;
    uint64_t incarnation;
    struct cl_call q[CORELINK_QUEUE];
    int qn;                  /* q[0] is on the wire when inflight */
    int inflight;
    int opening;             /* inflight, but q[0] waits for the connection (not sealed yet) */
    uint64_t nonce;          /* of the call on the wire */
    char lost[200];          /* why the call's last send got no answer, or "" */
    unsigned losses;         /* of the call on the wire, so far */
    int open_handles;        /* the timer; freed at 0 */
    int keep;                /* corelink_keep_open: probed while idle */
    uint32_t keep_ms;        /* idle time before that probe, jitter included */
    uint64_t keepalives;     /* probes sent by it */
} corelink;

/* Connects (asynchronously) to url, the control socket of core host/core of
 * process incarnation, whom every call names as its recipient (a core that
 * is another process now refuses them); NULL with e set on failure. */
corelink *corelink_new(uv_loop_t *loop, const auth *a, void *ctx, const char *url, const char *host, int core,
                       uint64_t incarnation, err *e);

/* Queues a call. UNAVAILABLE in e if the queue is full or sending fails now
 * (the callback is then not called). */
int corelink_probe(corelink *l, uint32_t timeout_ms, corelink_cb cb, uint64_t tag, int idx, err *e);
/* peers (may be NULL) is referenced by the call while it is queued. */
int corelink_reset(corelink *l, uint64_t epoch, int32_t replica_id, uint32_t num_replicas,
                   struct cl_peers *peers, uint32_t timeout_ms, corelink_cb cb, uint64_t tag, int idx, err *e);

/* Opens the connection now, with a probe (a worker closes a connection that
 * sends nothing within seconds), and keeps it open by probing it whenever it
 * has been idle for CORELINK_KEEPALIVE_MS and is still connected: the first
 * call after a long silence, an initialize of the whole pod, does not wait
 * for a connection (a TCP and SP handshake and the worker's first-touch of
 * its buffers, for every core at once). A probe that fails is not an error:
 * the next call connects again. Idempotent. */
void corelink_keep_open(corelink *l);

/* Is its connection made (and not closing)? */
int corelink_is_open(const corelink *l);

/* At most n links at once (each takes a descriptor); a link that would need
 * one more fails with RESOURCE_EXHAUSTED naming the open-file limit. Default:
 * no bound. */
void corelink_set_max_sockets(unsigned n);

/* Closes the link; queued calls complete with CANCELLED later, then l is freed. */
void corelink_close(corelink *l);

#endif
