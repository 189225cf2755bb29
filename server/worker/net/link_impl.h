/* link_impl: the insides of links and peers shared by peers.c (the set, aborts,
 * deferred completions), link.c (queues, progress timer, failures),
 * link_tcp.c (dp_conn glue) and shm.c (shared-memory rings). Not for the
 * engine: it uses link.h only. */
#ifndef TPUEMU_WORKER_COLL_LINK_IMPL_H
#define TPUEMU_WORKER_COLL_LINK_IMPL_H

#include <stdint.h>

#define TPUEMU_LINK_NO_TYPEDEF 1 /* <uv.h> brings unistd.h's link() */
#include <uv.h>

#include "dpconn.h"
#include "link.h"
#include "peers.h"

#define PEERS_FAILED_MAX 8
/* ABORTs one link holds for its peer at once: a failure fails the collective
 * running and the ones already posted after it (pipelined steps), and the
 * peer needs each of them. */
#define LINK_ABORTS_MAX 4

/* An ABORT for the peer: kept until its write completes, so that one written
 * into a connection that is cut goes again on the next. */
struct link_abort {
    uint64_t seq;
    int issued; /* written to the current out connection, not yet complete */
    err e;
};

enum lop_kind { LOP_SEND, LOP_RECV };

/* One pending link_send or link_recv. */
struct lop {
    struct lop *next;
    struct link *l;
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
    link_cb cb;
    void *arg;
    err *fail;       /* deferred failure to report */
    uint64_t t_post; /* uv_hrtime() when it was posted, for the profiler */
};

/* Records a completed chunk in the worker's profiler ring (trace.h). */
void link_trace_done(struct link *l, const struct lop *op);

struct lopq {
    struct lop *head, *tail;
};

struct shm_tx;
struct shm_rx;

struct link {
    struct peers *p;
    int replica;
    char name[96];          /* "host1/3" */
    char data_addr[256];
    int closing;            /* reset: no more callbacks; freed when refs reach 0 */
    int refs;               /* timer + conns + shm handles still open */

    /* outgoing half: TCP dial (lazy) or the shm segment we write */
    dp_conn *out;
    int out_ready;
    struct lopq sq;         /* sends not yet complete, in order */
    struct link_abort *aborts; /* LINK_ABORTS_MAX, allocated at the first */
    unsigned naborts;          /* ABORTs to write once out is ready, oldest first */

    /* incoming half: the peer's dial to us, or the segment it writes */
    dp_conn *in;
    struct lopq rq;         /* posted receives, in order */

    /* shared memory (shm.c); tx/rx NULL when TCP */
    int shm_tried;          /* shm set-up attempted (outgoing) */
    int shm_dialing;        /* set-up under way: sends wait for it */
    struct shm_tx *tx;
    struct shm_rx *rx;

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

struct peer_info {
    char host[64];
    int core;
    char data_addr[256];
    char shm_name[64];
    char control_addr[256];
    uint64_t incarnation;
};

struct failed_seq {
    uint64_t seq;
    int used;
    err e;
};

struct peers {
    struct worker *w;
    uv_loop_t *loop;
    int stopping;
    uint64_t epoch;
    int self;                  /* own replica, -1: not in the system */
    uint32_t n;
    struct peer_info *info;    /* n entries */
    struct link **links;       /* n entries, lazily made */
    unsigned timeout_ms;       /* silence after which a peer is probed */
    unsigned probe_ms;         /* how long a probe waits for the answer */
    unsigned stall_ms;         /* silence after which even a live peer is given up on */
    int tcp_only;

    struct lopq dq;            /* completions to deliver from the loop */
    uv_timer_t defer;
    int open_handles;

    struct failed_seq failed[PEERS_FAILED_MAX];
    unsigned nfailed;

    uint64_t cur_seq;          /* latest collective seen in link_send/recv */
    const char *cur_what;

    struct shm_listener *shm;  /* NULL: none (tcp only, or it failed) */
    char shm_name[64];         /* "" or "@tpuemu-..." as advertised */
    int shm_fallback_logged;
};

/* ---- peers.c ---- */
/* Queues op's callback (status from op->fail, OK when NULL) for the loop. */
void peers_defer(struct peers *p, struct lop *op);
/* Records the failure of seq, fails its operations everywhere, and (when
 * broadcast) sends ABORT to every other replica except culprit (-1: none). */
void peers_fail_seq(struct peers *p, uint64_t seq, const err *e, int broadcast, int culprit);
const char *peers_what_of(const struct peers *p, uint64_t seq);
/* The link to r made now if missing (no dial yet); NULL if r is not a peer. */
struct link *peers_link_get(struct peers *p, int r);

/* ---- link.c ---- */
struct link *link_new(struct peers *p, int r);
/* Closes both halves; pending operations are dropped without callbacks. */
void link_destroy(struct link *l);
void link_unref(struct link *l);
void lopq_push(struct lopq *q, struct lop *op);
struct lop *lopq_pop(struct lopq *q);
void link_progress(struct link *l);
/* The peer of l failed: every pending operation of l fails with e, the
 * collective of seq fails everywhere and the other replicas are told. */
void link_fail(struct link *l, uint64_t seq, const err *e);
/* Fails the operations of seq on l (deferred). */
void link_fail_seq(struct link *l, uint64_t seq, const err *e);
/* Queues an ABORT of collective seq for the peer (once per seq; when the queue
 * is full the newest entry gives way). 0, or -1 out of memory. */
int link_queue_abort(struct link *l, uint64_t seq, const err *e);
void link_arm(struct link *l);

/* ---- link_tcp.c ---- */
int tcp_dial(struct link *l, err *e);
void tcp_issue_sends(struct link *l);
void tcp_attach_in(struct link *l, dp_conn *c);
/* Writes every queued ABORT not yet written, if the out half is ready. */
void tcp_send_abort(struct link *l);
/* The posted receive at the head of rq changed: resume a paused reader. */
void tcp_recv_posted(struct link *l);

/* ---- shm.c ---- */
struct shm_listener;
int shm_listen(struct peers *p, err *e);
void shm_listener_close(struct peers *p);
/* Starts the shared-memory set-up of l's outgoing half; CODE_OK when it is
 * under way (sends wait), else the caller falls back to TCP. */
int shm_connect(struct link *l, err *e);
void shm_kick_tx(struct link *l);
void shm_kick_rx(struct link *l);
void shm_close(struct link *l);
uint64_t shm_bytes_in(const struct link *l);

#endif
