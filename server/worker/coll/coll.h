/* coll: the collectives engine of one worker. A client sends every replica a
 * FRAME_COLL with the same CollSpec and sequence number, and this replica's
 * input as payload; each worker runs its part of the algorithm over its links
 * (link.h) on the loop thread, as a state machine driven by link callbacks, and
 * answers FRAME_COLL_RESULT with the status, the time per iteration and this
 * replica's output.
 *
 * Algorithms: ring (pipelined reduce-scatter + all-gather), hd (recursive
 * halving-doubling with the non-power-of-two fix-up), hier (inside each host,
 * then across hosts); broadcast, all-gather, reduce-scatter; replica groups.
 * bf16 is reduced in float32 and rounded once at the end. Every core ends with
 * bitwise identical values; reproducible mode makes sums bitwise independent of
 * algorithm, chunking and core count.
 *
 * After a collective fails the worker refuses further collectives with
 * FAILED_PRECONDITION until the system is re-initialized (coll_reset). */
#ifndef TPUEMU_WORKER_COLL_COLL_H
#define TPUEMU_WORKER_COLL_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tpuemu.pb-c.h"

struct worker;
struct dp_conn;

/* Creates the engine (w->coll); CODE_OK or an error code. */
int coll_init(struct worker *w);
void coll_free(struct worker *w);

/* A FRAME_COLL from a client connection. payload (malloc'd, may be NULL when
 * len is 0) belongs to the callee. The answer goes back on c, unless c closes
 * first. */
void coll_on_client_frame(struct worker *w, struct dp_conn *c, const Tpuemu__FrameHeader *h,
                          uint8_t *payload, size_t len);
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
void coll_submit(struct worker *w, const Tpuemu__FrameHeader *h, uint8_t *payload, size_t len, coll_done_fn done,
                 void *arg);

/* c is closing: drop references to it (collectives in flight still finish). */
void coll_on_client_close(struct worker *w, struct dp_conn *c);

/* The system was reset (ResetCore): fail whatever runs, forget all state. */
void coll_reset(struct worker *w);

#endif
