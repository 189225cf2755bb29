/* coll: the collectives engine of one worker. A client sends every replica a
 * FRAME_COLL with the same CollSpec and sequence number, and this replica's
 * input as payload; each worker runs its part of the algorithm over the
 * transport (net/xport.h) on the loop thread, as a state machine driven by its
 * callbacks, and answers FRAME_COLL_RESULT with the status, the time per iteration and this
 * replica's output.
 *
 * Algorithms: ring (pipelined reduce-scatter + all-gather), hd (recursive
 * halving-doubling with the non-power-of-two fix-up), hier (inside each host,
 * then across hosts); broadcast, all-gather, reduce-scatter; replica groups.
 * bf16 is reduced in float32 and rounded once at the end. Every core ends with
 * bitwise identical values; reproducible mode makes sums bitwise independent of
 * algorithm, chunking and core count.
 *
 * The engine moves bytes only through the transport it is given (xport.h),
 * and knows its core through the env: it never reaches for the daemon.
 *
 * After a collective fails the worker refuses further collectives with
 * FAILED_PRECONDITION until the system is re-initialized (coll_reset). Loop
 * thread only. */
#ifndef TPUEMU_WORKER_COLL_COLL_H
#define TPUEMU_WORKER_COLL_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "dpconn.h"
#include "hbm.h"
#include "ident.h"
#include "prom.h"
#include "status.h"
#include "tpuemu.pb-c.h"
#include "xport.h"

struct coll;

#define COLL_STAT_KINDS 5 /* CollKind 1..4 (all-reduce, broadcast, all-gather, reduce-scatter) */

/* Counters the engine bumps (relaxed atomic adds) and its owner reads. */
struct coll_stats {
    prom_counter done[COLL_STAT_KINDS]; /* completed, by CollKind */
    prom_counter failed;
    prom_counter allreduce_bytes;       /* input bytes of every all-reduce done, per iteration */
};

/* What the engine needs from its owner; every pointer must outlive it. */
struct coll_env {
    const struct core_ident *id; /* epoch, replica and replicas of the system; names in messages */
    hbm *hbm;                    /* a collective's buffers are charged to it while it runs */
    struct xport x;              /* the transport to the other replicas */
    struct coll_stats *stats;    /* initialized by coll_stats_init */
};

void coll_stats_init(struct coll_stats *s);

/* Creates the engine; NULL when out of memory. */
struct coll *coll_new(const struct coll_env *env);
void coll_free(struct coll *c);

/* HBM a collective of spec sp among g replicas needs on one core (buffers
 * and pipeline slots). */
uint64_t coll_plan_bytes(const Tpuemu__CollSpec *sp, int g);

/* The header of a client's FRAME_COLL, before its payload is read: every check
 * the header decides, the announced payload_bytes against this replica's input
 * size for the collective and the collective's HBM against what this core can
 * give it. 1: read the payload; 0: refused, the answer (COLL_RESULT with the
 * error, and the collective failed on the peers) is on conn: drop the payload
 * unread, allocating nothing for it. */
int coll_check_client_header(struct coll *c, dp_conn *conn, const Tpuemu__FrameHeader *h);

/* A FRAME_COLL from a client connection. payload (malloc'd, may be NULL when
 * len is 0) belongs to the callee. The answer goes back on conn, unless conn
 * closes first. */
void coll_on_client_frame(struct coll *c, dp_conn *conn, const Tpuemu__FrameHeader *h, uint8_t *payload,
                          size_t len);
/* A collective this worker starts itself (the training step's gradient
 * all-reduce): h as a client's FRAME_COLL (epoch, seq, coll), payload its input.
 * The payload is borrowed, not taken over: an f32 all-reduce runs in it (out
 * is then payload). It must stay valid and must not be written until done has
 * been called, and after a failure until the next coll_reset (a failed
 * collective's link operations may still touch it until then). Every replica
 * must submit the same seq, spec and size. The answer goes to done(arg, e,
 * out, out_len) on the loop thread instead of a connection, exactly once: at
 * once when the collective is refused, else when it completes, fails or the
 * system is reset. out (this replica's output, out_len bytes) is valid during
 * the call only; done may call coll_submit again. */
typedef void (*coll_done_fn)(void *arg, const err *e, const uint8_t *out, size_t out_len);
void coll_submit(struct coll *c, const Tpuemu__FrameHeader *h, uint8_t *payload, size_t len, coll_done_fn done,
                 void *arg);

/* Fails collective seq on every peer with e (it will not be submitted here:
 * they fail at once instead of at the progress timeout). */
void coll_abort(struct coll *c, uint64_t seq, const err *e);

/* conn is closing: drop references to it (collectives in flight still finish). */
void coll_on_client_close(struct coll *c, dp_conn *conn);

/* The system was reset (ResetCore; the env's ident already names the new
 * epoch): fail whatever runs, forget all state. Call after the transport
 * dropped the old epoch's operations. */
void coll_reset(struct coll *c);

#endif
