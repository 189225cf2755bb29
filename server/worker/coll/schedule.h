/* schedule: a collective as a schedule, i.e. a DAG of operations on one core:
 * SEND/RECV a byte range to/from a peer over its link, LOCAL kernels (reduce,
 * convert, scale) and NOP barriers. Algorithms (ring.c, hd.c, hier.c,
 * bcast.c) only build schedules; this file runs them. That keeps every
 * algorithm a short generator, and gives all of them the same pipelining
 * (independent chunks overlap), the same per-link ordering and one failure
 * path.
 *
 * Execution: an operation starts once all its dependencies completed. SENDs
 * to a peer are posted in the order they were built, and so are RECVs from a
 * peer: both cores build their schedules with the same generator, so the
 * n-th send of a to b matches the n-th receive of b from a, and the link can
 * check (seq, step, chunk, offset, length). LOCAL ops run on the loop thread
 * as soon as they are ready.
 *
 * Receives that reduce go through a ring of temporary slots (nslots x
 * slot_bytes); a receive waits for the reduce that last used its slot, which
 * bounds both memory and the number of receives in flight (the pipeline depth).
 * Where the transport offers it (xport fuse: shared memory), a receive that
 * reduces is one RECV op instead, posted once the reduce may run, whose bytes
 * are reduced straight from the link's ring (one copy less per byte).
 *
 * Lifetime: the schedule owns its buffers (sched_own). After done() reports a
 * failure, link callbacks may still be pending: release it with
 * sched_release(), which frees it once the last one came back. */
#ifndef TPUEMU_WORKER_COLL_SCHEDULE_H
#define TPUEMU_WORKER_COLL_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "xport.h"

enum sop_type { SOP_SEND, SOP_RECV, SOP_LOCAL, SOP_NOP };

/* buffers */
enum { SB_W, SB_O, SB_T, SB_I, SB_X, SB_Q, SB_B, SB_N }; /* SB_B: barrier and hand-shake words (direct.c) */

struct sched;

struct sop {
    struct sched *s;
    uint8_t type, kern, state, dbuf, sbuf;
    uint8_t fused;        /* RECV: reduce with kern into dbuf as the bytes arrive */
    int32_t peer;         /* SEND/RECV: group rank */
    uint32_t step, chunk; /* SEND/RECV: identity on the wire */
    uint64_t doff, soff, len, woff; /* bytes; woff: offset named on the wire */
    uint64_t aux;         /* LOCAL: kernel argument */
    uint32_t ndeps, deps_left, succ0, nsucc;
};

typedef void (*sched_local_fn)(struct sched *s, const struct sop *op);
/* a reduction kernel on len bytes: dst op= src */
typedef void (*sched_reduce_fn)(struct sched *s, int kern, uint8_t *dst, const uint8_t *src, size_t len);
typedef void (*sched_done_fn)(struct sched *s, const err *e);

struct sched_peer {
    struct xport_chan *ch; /* made at the first send or receive */
    uint32_t *q[2]; /* send, recv op ids in build order */
    uint32_t n[2], cur[2];
};

struct sched {
    /* description */
    uint64_t seq;
    const char *what;             /* "all-reduce", ... */
    int g, me;                    /* group size, my rank in it */
    int *replica;                 /* group rank -> replica id */
    struct xport x;               /* the transport */
    uint8_t *buf[SB_N];
    size_t slot_bytes;
    int nslots;
    sched_local_fn local;
    sched_reduce_fn reduce;       /* for fused receives; NULL: none are built */
    sched_done_fn done;
    void *owner;

    /* ops */
    struct sop *ops;
    uint32_t nops, cap;
    uint32_t (*edges)[2];
    uint32_t nedges, ecap;
    uint32_t *succ;
    struct sched_peer *pp;
    int slot_next;
    int32_t *slot_user;

    /* running */
    uint32_t *stack, nstack;
    uint32_t ndone, outstanding, iter;
    int running, failed, released, finished;
    err fail;
    void *owned[8];
    int nowned;
    /* released but still waiting for link callbacks: on the owner's list */
    struct sched **zhead, *zprev, *znext;
    int nsend_ops, nrecv_ops;
};

/* A schedule for rank me of g (replica[] maps ranks to replicas; copied).
 * NULL when out of memory. */
struct sched *sched_new(uint64_t seq, const char *what, int g, int me, const int *replica,
                        struct xport x, size_t slot_bytes, int nslots);
/* Frees now (never while it runs; see sched_release). */
void sched_free(struct sched *s);
/* Frees once no link callback is pending (possibly now). Until then it stays on
 * *zombies (may be NULL), so its owner can free it for good once no callback
 * can come any more (the links were reset or stopped): sched_free_zombies(). */
void sched_release(struct sched *s, struct sched **zombies);
void sched_free_zombies(struct sched **zombies);
/* Frees p with the schedule. */
int sched_own(struct sched *s, void *p);

/* Builders: return the op id, or -1 on out of memory (the schedule is then
 * marked failed and sched_finish refuses it). dep: an op id or -1. */
int sched_send(struct sched *s, int peer, int buf, uint64_t off, uint64_t len, uint32_t step,
               uint32_t chunk, uint64_t woff, int dep);
int sched_recv(struct sched *s, int peer, int buf, uint64_t off, uint64_t len, uint32_t step,
               uint32_t chunk, uint64_t woff, int dep);
int sched_local(struct sched *s, int kern, int dbuf, uint64_t doff, int sbuf, uint64_t soff, uint64_t len, uint64_t aux,
                int dep);
void sched_dep(struct sched *s, int from, int to);
/* RECV into the next temporary slot, then LOCAL kern(dbuf+doff, slot, len):
 * returns the LOCAL's id. dep2: another dependency of the LOCAL (-1: none).
 * When s->reduce is set and the transport fuses this peer and length: one
 * fused RECV depending on dep and dep2, whose id is returned. */
int sched_recv_reduce(struct sched *s, int peer, int kern, int dbuf, uint64_t doff, uint64_t len,
                      uint32_t step, uint32_t chunk, uint64_t woff, int dep, int dep2);
/* A NOP that depends on every op built since op id `since`, and on dep (so
 * that an empty range still orders what follows after dep). */
int sched_barrier(struct sched *s, uint32_t since, int dep);

/* Ends building: CODE_OK or CODE_RESOURCE_EXHAUSTED. */
int sched_finish(struct sched *s, err *e);

/* Runs it once (iteration iter: part of the step on the wire); done() is
 * called exactly once, possibly before this returns (nothing to send). */
void sched_run(struct sched *s, uint32_t iter);

#endif
