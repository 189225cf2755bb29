/* chan_impl: the insides of channels (the link to one peer replica) and
 * peers, shared by the layers of the transport, from the top:
 *   peers.c     the set of channels of one epoch, failures broadcast as
 *               ABORTs, the xport ops table; it gives chan.c the transports
 *               and the link-fault layer
 *   hold.c      link faults (delay, loss, partition): the sends they hold
 *               back before chan.c issues them
 *   chan_tcp.c  the TCP transport (dp_conn glue)
 *   shm.c       the shared-memory transport (rings, set-up, listener)
 *   chan.c      the channel itself: queues, progress timer, failures and
 *               their messages, deferred completions, the failed
 *               collectives, and the choice of transport
 * Each half of a channel (tx: the sends, rx: the receives) holds the ops of
 * the transport that moves its chunks and that transport's state of it;
 * chan.c works through them only (struct chan_ops) and has no transport of
 * its own. ABORTs always travel over TCP (the channel's ctl, also an ops
 * pointer and state), whichever transport moves the chunks. Each file calls
 * only the ones below it: chan.c reaches the transports, the link-fault
 * layer and the set through pointers peers.c installs. Not for the engine:
 * it uses xport.h only. */
#ifndef TPUEMU_WORKER_NET_CHAN_IMPL_H
#define TPUEMU_WORKER_NET_CHAN_IMPL_H

#include <stdint.h>

#include <uv.h>

#include "auth.h"
#include "dpconn.h"
#include "ident.h"
#include "trace.h"
#include "peertab.h"
#include "xport.h"

#define PEERS_FAILED_MAX 8
/* ABORTs one link holds for its peer at once: a failure fails the collective
 * running and the ones already posted after it (pipelined steps), and the
 * peer needs each of them. */
#define CHAN_ABORTS_MAX 4
/* Link faults a worker keeps at once, one per peer core (hold.c). */
#define PEERS_LINK_FAULTS 16

/* An ABORT for the peer: kept until its write completes, so that one written
 * into a connection that is cut goes again on the next. */
struct chan_abort {
    uint64_t seq;
    int issued; /* written to the current out connection, not yet complete */
    err e;
};

enum lop_kind { LOP_SEND, LOP_RECV };

/* One pending chan_send or chan_recv. */
struct lop {
    struct lop *next;
    struct chan *l;
    enum lop_kind kind;
    uint64_t seq;
    uint32_t step, chunk;
    uint64_t offset;
    const char *what;
    uint8_t *buf;
    size_t len;
    size_t done;     /* shm: bytes moved so far */
    int issued;      /* TCP send: handed to dp_conn (its write callback frees it) */
    int failed;      /* an issued send whose collective failed: report failure when written */
    xport_cb cb;
    void *arg;
    xport_reduce_fn red; /* receive: combine the bytes into buf instead of copying (recv_reduce) */
    void *red_arg;
    err *fail;       /* deferred failure to report */
    uint64_t t_post; /* uv_hrtime() when it was posted, for the profiler */
    uint64_t release; /* a send held by a link fault: uv_now ms when it may go */
};


struct lopq {
    struct lop *head, *tail;
};

struct chan;

/* A fault on the link to one peer core (peers.h: peers_link_fault), kept by
 * the peer's name so that it outlives the channels of an epoch. */
struct link_fault {
    int kind;              /* FaultKind LINK_DELAY, LINK_LOSS, PARTITION; 0: the slot is free */
    char peer[96];         /* "host1/3", as chan.name */
    uint32_t latency_ms;   /* delay */
    uint32_t percent;      /* loss */
    uint64_t until;        /* uv_now ms: its end */
    uint32_t rng;          /* loss: xorshift32 state */
    uint64_t held, lost;   /* chunks held back, transmissions lost: logged at its end */
};

/* One transport's side of a channel's half (chan_tcp.c: chan_tcp_tx,
 * chan_tcp_rx, chan_tcp_ctl; shm.c: chan_shm_tx, chan_shm_rx). chan.c calls
 * them; they call chan.c back through its functions below, never the set.
 * Members a half does not use are NULL. */
struct chan_ops {
    const char *name; /* "tcp", "shm": the profiler's SEND/RECV events */
    int shm;          /* 1: the bytes go through shared memory (xport's is_shm) */
    /* tx: starts the set-up of the half; CODE_OK when under way (shm: the
     * sends wait for chan_tx_ready, or chan_tx_failed gives them to TCP).
     * ctl: makes the state (no connection yet). */
    int (*start)(struct chan *l, err *e);
    /* tx: sends were queued: issue what the half can take now (TCP: dials
     * first when it has no connection). rx: the receive at the head of rq
     * changed: take what has arrived for it. */
    void (*kick)(struct chan *l);
    /* optional: the loop polls (chan_spin): look again without a wake-up */
    void (*poll)(struct chan *l);
    /* rx: bytes received so far (progress, for timeouts) */
    uint64_t (*bytes_in)(const struct chan *l);
    /* rx, optional: the head receive's collective failed: stop filling its
     * buffer */
    void (*discard)(struct chan *l);
    /* tx, optional: a failed collective's writes were issued and did not
     * drain in the grace period: cut them (the queued ABORTs go again) */
    void (*unstick)(struct chan *l);
    /* ctl: writes the queued ABORTs, connecting first if needed */
    void (*abort)(struct chan *l);
    /* Closes this transport's part of the half (ctl: the TCP connections,
     * which carry a TCP half's chunks too); no callback about it follows. */
    void (*close)(struct chan *l);
    /* ctl, optional: frees the state with the channel */
    void (*release)(struct chan *l);
};

/* A half of a channel: the transport that moves it and that transport's
 * state of it (opaque here; NULL ops: none yet). */
struct chan_half {
    const struct chan_ops *ops;
    void *st;
};

struct chan {
    struct peers *p;
    int replica;
    char name[96];          /* "host1/3" */
    char data_addr[256];
    int closing;            /* reset: no more callbacks; freed when refs reach 0 */
    int refs;               /* timer + conns + shm handles still open */

    /* the halves: tx chosen at the first send (chan.c), rx by the
     * transport the peer's chunks come by; ctl: TCP, for the ABORTs */
    struct chan_half tx, rx, ctl;

    struct lopq sq;         /* sends not yet complete, in order */
    struct lopq rq;         /* posted receives, in order */
    /* a link fault: chan_send holds sends back in hq (in order, each until
     * its op->release) while lf is set or hq is not empty; holding says so
     * in one word, so that a link without a fault pays one branch */
    int holding;
    struct link_fault *lf;  /* the fault on this link; NULL: none */
    struct lopq hq;
    struct chan_abort *aborts; /* CHAN_ABORTS_MAX, allocated at the first */
    unsigned naborts;          /* ABORTs to write once ctl is ready, oldest first */

    /* the peer's host segment (its fourth fd in the shm hello), read-only,
     * mapped until the channel is destroyed (xport seg) */
    const uint8_t *pseg;
    size_t pseg_len;

    /* progress: one timer per link */
    uv_timer_t timer;
    int timer_on;
    uint64_t last_progress; /* uv_now ms */
    uint64_t last_in;       /* bytes-read counter seen last */
    uint64_t grace_until;   /* after a failure: close a stuck out conn then */
    uint64_t linger_until;  /* in conn lost: wait this long for an ABORT first */
    struct probe *probe;    /* liveness probe under way after a silence */
    uint64_t silent_since;  /* uv_now ms of the last progress before probes said "alive" */
    err *linger_err;
};

struct failed_seq {
    uint64_t seq;
    int used;
    err e;
};

struct peers {
    /* from the owner (peers.h: struct peers_env) */
    const auth *auth;
    const struct core_ident *id;
    struct trace *trace;
    uv_loop_t *loop;
    int stopping;
    uint64_t epoch;
    int self;                  /* own replica, -1: not in the system */
    uint32_t n;
    struct peertab *tab;       /* the n replicas (ResetCore.peer_table), NULL outside a system */
    struct chan **links;       /* n entries, lazily made */
    unsigned timeout_ms;       /* silence after which a peer is probed */
    unsigned probe_ms;         /* how long a probe waits for the answer */
    unsigned stall_ms;         /* silence after which even a live peer is given up on */
    uint32_t machine_cores;    /* the cluster's busiest machine: emulated cores on it */
    uint32_t machine_cpus;     /* and its CPUs (ResetCore); named when a peer is blamed */
    int tcp_only;

    struct lopq dq;            /* completions to deliver from the loop */
    uv_timer_t defer;
    uv_idle_t spin;            /* polls while a receive waits (chan_spin) */
    int spin_on;
    uint64_t spin_until;       /* uv_hrtime() ns: stop polling then */
    uint64_t spin_ns;          /* how long after the last progress; 0: never poll */
    int open_handles;

    struct failed_seq failed[PEERS_FAILED_MAX];
    unsigned nfailed;

    uint64_t cur_seq;          /* latest collective seen in chan_send/recv */
    const char *cur_what;

    struct shm_listener *shm;  /* NULL: none (tcp only, or it failed) */
    char shm_name[64];         /* "" or "@tpuemu-..." as advertised */
    int shm_fallback_logged;
    /* this core's host segment for the epoch (peers.c: made at reset when a
     * same-host peer offers shared memory; shm.c passes segfd in its hello) */
    int segfd;
    uint8_t *seg;
    size_t seg_len;

    /* set by peers.c: the transports chan.c chooses from (the halves' ops
     * of TCP and shared memory, and the ctl, TCP), the set-level failure of
     * a collective (records it, fails its operations on every channel and,
     * when broadcast, sends ABORT to every other replica except culprit, -1:
     * none), and the link-fault layer (hold.c) */
    const struct chan_ops *tcp_tx, *shm_tx, *ctl;
    void (*fail_seq)(struct peers *p, uint64_t seq, const err *e, int broadcast, int culprit);
    const struct chan_faults *faults;

    /* link faults (hold.c) and the one timer for all of them: the next held
     * send due, or the next end of a fault */
    struct link_fault lfaults[PEERS_LINK_FAULTS];
    uv_timer_t hold;
    uint64_t hold_due;         /* uv_now ms the timer is set for; 0: not set */
};

/* The link-fault layer (hold.c) as chan.c sees it. */
struct chan_faults {
    /* A new channel: the fault on its link, if any. */
    void (*attach)(struct chan *l);
    /* Takes op (a send on l, l->holding set) into l->hq until the link's
     * fault lets it go; sends it now if nothing holds the link any more. */
    void (*send)(struct chan *l, struct lop *op);
    /* "core h0/1 is cut off from core h0/0 by a partition (...)" when l's
     * link is partitioned and its head op has waited past the silence
     * timeout: 1 with e set, else 0. */
    int (*partitioned)(const struct chan *l, uint64_t now, err *e);
};

/* ---- chan.c: what every channel of the set shares ---- */
/* 1 when replica r (not this core) runs on this core's host and offers
 * shared memory. */
static inline int peers_same_host_shm(const struct peers *p, int r)
{
    return p->tab && peertab_has_shm(p->tab, (size_t)r) &&
           peertab_host_index(p->tab, (size_t)r) == peertab_host_index(p->tab, (size_t)p->self);
}

/* CODE_OK, or the error collective seq already failed with here. e may be NULL. */
int chan_seq_failed(const struct peers *p, uint64_t seq, err *e);
/* Queues op's callback (status from op->fail, OK when NULL) for the loop. */
void chan_defer(struct peers *p, struct lop *op);
/* Name of collective seq ("all-reduce") from the operations still pending. */
const char *chan_what_of(const struct peers *p, uint64_t seq);
/* The channel to r made now if missing (no dial yet); NULL if r is not a peer. */
struct chan *chan_get(struct peers *p, int r);

/* ---- chan.c: one channel ---- */
/* The contract of xport.h's send, recv, peer_name and is_shm, on one channel. */
int chan_send(struct chan *l, const struct xport_chunk *c, const void *buf, size_t len, xport_cb cb, void *arg);
/* Queues a send that may go now and issues it (chan_send, and hold.c when a
 * held send is due). */
void chan_send_now(struct chan *l, struct lop *op);
int chan_recv(struct chan *l, const struct xport_chunk *c, void *buf, size_t len, xport_cb cb, void *arg);
/* xport.h's recv_reduce and fuse. */
int chan_recv_reduce(struct chan *l, const struct xport_chunk *c, void *buf, size_t len, xport_reduce_fn red,
                     void *red_arg, xport_cb cb, void *arg);
const char *chan_peer_name(const struct chan *l);
int chan_is_shm(const struct chan *l);
struct chan *chan_new(struct peers *p, int r);
/* Closes both halves; pending operations are dropped without callbacks. */
void chan_destroy(struct chan *l);
void chan_unref(struct chan *l);
void lopq_push(struct lopq *q, struct lop *op);
struct lop *lopq_pop(struct lopq *q);
void chan_progress(struct chan *l);
/* Keeps the loop polling (not sleeping) for spin_ns while a receive waits. */
void chan_spin(struct peers *p);
/* The peer of l failed: every pending operation of l fails with e, the
 * collective of seq fails everywhere and the other replicas are told. */
void chan_fail(struct chan *l, uint64_t seq, const err *e);
/* Fails the operations of seq on l (deferred). */
void chan_fail_seq(struct chan *l, uint64_t seq, const err *e);
/* Queues an ABORT of collective seq for the peer (once per seq; when the queue
 * is full the newest entry gives way). 0, or -1 out of memory. */
int chan_queue_abort(struct chan *l, uint64_t seq, const err *e);
void chan_arm(struct chan *l);
/* An ABORT of seq came from l's peer: the collective fails here (not passed on). */
void chan_aborted(struct chan *l, uint64_t seq, const err *e);
/* Records a completed chunk in the profiler's ring (trace.h). */
void chan_trace_done(struct chan *l, const struct lop *op);
/* The outgoing half's set-up (chan_ops.start): done (the sends go), or
 * failed (TCP takes them; why, when given, is logged once per worker). */
void chan_tx_ready(struct chan *l);
void chan_tx_failed(struct chan *l, const char *why);
/* The outgoing half's transport closed (it failed or was cut): TCP takes the
 * sends from now on. */
void chan_tx_lost(struct chan *l);
/* The peer's chunks come by ops (its state st) from now on: the transport
 * says so when they start to. The half it replaces is closed. */
void chan_rx_use(struct chan *l, const struct chan_ops *ops, void *st);
/* The incoming half's transport (state st) closed. */
void chan_rx_lost(struct chan *l, const void *st);

/* ---- chan_tcp.c ---- */
extern const struct chan_ops chan_tcp_tx, chan_tcp_rx, chan_tcp_ctl;
/* The peer's dial to us (peers_accept): its chunks and ABORTs come on it. */
void tcp_attach_in(struct chan *l, dp_conn *c);

/* ---- hold.c ---- */
extern const struct chan_faults hold_faults;
/* The timer, from peers_new and peers_stop. */
void hold_init(struct peers *p);
void hold_close(struct peers *p, uv_close_cb cb);

/* ---- shm.c ---- */
extern const struct chan_ops chan_shm_tx, chan_shm_rx;
/* The bytes a shared-memory ring holds (x_fuse's bound). */
size_t shm_ring_bytes(void);
struct shm_listener;
int shm_listen(struct peers *p, err *e);
void shm_listener_close(struct peers *p);

#endif
