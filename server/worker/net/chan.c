/* chan: the transport-independent half of a channel to one peer replica: the
 * ordered queues of pending sends and receives, the one progress timer per
 * channel, failures with the messages users see ("core host1/3 never sent
 * chunk 5 of all-reduce #812"), and the choice of transport (shared memory
 * with a same-host peer, else TCP, also when the shared-memory set-up
 * fails: chan_pick_tx, the one place that installs a transport on the
 * outgoing half). The bytes move in chan_tcp.c or shm.c, reached through the
 * ops each half holds (chan_impl.h: struct chan_ops); what all channels of
 * one worker share (deferred completions, the collectives that failed) is
 * kept here too. */
#include "chan_impl.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "log.h"
#include "machine.h"
#include "probe.h"
#include "trace.h"

void lopq_push(struct lopq *q, struct lop *op)
{
    op->next = NULL;
    if (q->tail)
        q->tail->next = op;
    else
        q->head = op;
    q->tail = op;
}

struct lop *lopq_pop(struct lopq *q)
{
    struct lop *op = q->head;
    if (op) {
        q->head = op->next;
        if (!q->head)
            q->tail = NULL;
        op->next = NULL;
    }
    return op;
}

static const err ok_err = {CODE_OK, ""};

static void on_link_timer(uv_timer_t *t);

/* ---- what every channel of the set shares ---- */

static void on_defer(uv_timer_t *t)
{
    struct peers *p = t->data;
    struct lop *op;
    /* callbacks may queue more; they run in this pass too */
    while ((op = lopq_pop(&p->dq)) != NULL) {
        op->cb(op->arg, op->fail ? op->fail : &ok_err);
        free(op->fail);
        free(op);
    }
}

void chan_defer(struct peers *p, struct lop *op)
{
    lopq_push(&p->dq, op);
    if (!uv_is_active((uv_handle_t *)&p->defer))
        uv_timer_start(&p->defer, on_defer, 0, 0);
}

int chan_seq_failed(const struct peers *p, uint64_t seq, err *e)
{
    if (!p || p->stopping)
        return CODE_OK;
    for (unsigned i = 0; i < PEERS_FAILED_MAX; i++)
        if (p->failed[i].used && p->failed[i].seq == seq) {
            if (e)
                *e = p->failed[i].e;
            return p->failed[i].e.code != CODE_OK ? p->failed[i].e.code : CODE_UNKNOWN;
        }
    return CODE_OK;
}

const char *chan_what_of(const struct peers *p, uint64_t seq)
{
    for (uint32_t i = 0; i < p->n; i++) {
        const struct chan *l = p->links ? p->links[i] : NULL;
        if (!l)
            continue;
        for (const struct lop *op = l->rq.head; op; op = op->next)
            if (op->seq == seq)
                return op->what;
        for (const struct lop *op = l->sq.head; op; op = op->next)
            if (op->seq == seq)
                return op->what;
        for (const struct lop *op = l->hq.head; op; op = op->next)
            if (op->seq == seq)
                return op->what;
    }
    if (p->cur_seq == seq && p->cur_what)
        return p->cur_what;
    return "collective";
}

struct chan *chan_get(struct peers *p, int r)
{
    if (p->stopping || r < 0 || (uint32_t)r >= p->n || r == p->self || !p->links)
        return NULL;
    if (!p->links[r])
        p->links[r] = chan_new(p, r);
    return p->links[r];
}

/* ---- one channel ---- */

static void on_timer_closed(uv_handle_t *h);

struct chan *chan_new(struct peers *p, int r)
{
    struct chan *l = calloc(1, sizeof *l);
    err e;
    if (!l)
        return NULL;
    l->p = p;
    l->replica = r;
    snprintf(l->name, sizeof l->name, "%s/%d", peertab_host(p->tab, (size_t)r), peertab_core(p->tab, (size_t)r));
    peertab_data_addr(p->tab, (size_t)r, l->data_addr, sizeof l->data_addr);
    uv_timer_init(p->loop, &l->timer);
    l->timer.data = l;
    l->refs = 1;
    l->ctl.ops = p->ctl;
    if (l->ctl.ops->start(l, &e) != CODE_OK) {
        uv_close((uv_handle_t *)&l->timer, on_timer_closed);
        return NULL;
    }
    p->faults->attach(l);
    return l;
}

void chan_unref(struct chan *l)
{
    if (--l->refs > 0)
        return;
    if (l->ctl.ops && l->ctl.ops->release)
        l->ctl.ops->release(l);
    free(l->aborts);
    free(l->linger_err);
    free(l);
}

static void on_timer_closed(uv_handle_t *h)
{
    chan_unref(h->data);
}

static void drop_queue(struct lopq *q, int keep_issued)
{
    struct lop *op, *next;
    for (op = q->head; op; op = next) {
        next = op->next;
        if (keep_issued && op->issued) {
            op->l = NULL; /* its write callback frees it */
            continue;
        }
        free(op->fail);
        free(op);
    }
    q->head = q->tail = NULL;
}

/* Closes every transport's part of l: the halves, then the ctl. */
static void close_halves(struct chan *l)
{
    if (l->tx.ops)
        l->tx.ops->close(l);
    if (l->rx.ops)
        l->rx.ops->close(l);
    l->ctl.ops->close(l);
}

void chan_destroy(struct chan *l)
{
    if (l->closing)
        return;
    l->closing = 1;
    drop_queue(&l->rq, 0);
    drop_queue(&l->hq, 0);
    drop_queue(&l->sq, 1);
    /* writes stop now; their callbacks (from the loop) free issued ops */
    close_halves(l);
    if (l->pseg) {
        munmap((void *)(uintptr_t)l->pseg, l->pseg_len);
        l->pseg = NULL;
    }
    if (l->probe) {
        probe_cancel(l->probe);
        l->probe = NULL;
        chan_unref(l);
    }
    uv_timer_stop(&l->timer);
    uv_close((uv_handle_t *)&l->timer, on_timer_closed);
}

const char *chan_peer_name(const struct chan *l)
{
    return l->name;
}

/* A half moves its bytes through shared memory once its set-up is done. */
static int half_shm(const struct chan_half *h)
{
    return h->ops && h->ops->shm && h->st;
}

int chan_is_shm(const struct chan *l)
{
    return half_shm(&l->tx) || half_shm(&l->rx);
}

static uint64_t bytes_in(const struct chan *l)
{
    return l->rx.ops ? l->rx.ops->bytes_in(l) : 0;
}

void chan_progress(struct chan *l)
{
    l->last_progress = uv_now(l->p->loop);
    l->silent_since = 0;
    chan_spin(l->p);
}

/* The idle handle keeps the loop polling (epoll with a zero timeout) while a
 * receive waits; shared-memory rings are looked at directly, without the
 * eventfd wake-up (shm.c asks for none while this runs, and for them all when
 * it stops). */
static void on_spin(uv_idle_t *h)
{
    struct peers *p = h->data;
    int waiting = 0;

    if (!p->stopping && uv_hrtime() < p->spin_until)
        for (uint32_t i = 0; i < p->n; i++) {
            struct chan *l = p->links ? p->links[i] : NULL;
            if (!l || l->closing)
                continue;
            if (l->rq.head) {
                waiting = 1;
                if (l->rx.ops && l->rx.ops->poll)
                    l->rx.ops->poll(l);
            }
            if (l->sq.head && half_shm(&l->tx) && l->tx.ops->poll) {
                waiting = 1;
                l->tx.ops->poll(l);
            }
        }
    if (!waiting) {
        uv_idle_stop(h);
        p->spin_on = 0;
        /* going to sleep: the shared-memory rings ask for their wake-ups now */
        for (uint32_t i = 0; !p->stopping && i < p->n; i++) {
            struct chan *l = p->links ? p->links[i] : NULL;
            if (l && !l->closing && l->rq.head && l->rx.ops && l->rx.ops->poll)
                l->rx.ops->poll(l);
            if (l && !l->closing && l->sq.head && half_shm(&l->tx) && l->tx.ops->poll)
                l->tx.ops->poll(l);
        }
        return;
    }
    sched_yield();
}

void chan_spin(struct peers *p)
{
    if (!p->spin_ns || p->stopping)
        return;
    p->spin_until = uv_hrtime() + p->spin_ns;
    if (!p->spin_on) {
        p->spin_on = 1;
        uv_idle_start(&p->spin, on_spin);
    }
}

/* The progress check runs every timeout/8 (5..250 ms) while anything is
 * pending (or a grace/linger deadline is set): a failure is seen at most
 * timeout + one period after the last byte moved. */
static unsigned tick_ms(const struct chan *l)
{
    unsigned t = l->p->timeout_ms / 8;
    return t < 5 ? 5 : t > 250 ? 250 : t;
}

void chan_arm(struct chan *l)
{
    if (l->closing)
        return;
    if (!l->sq.head && !l->rq.head && !l->hq.head && !l->grace_until && !l->linger_until) {
        if (l->timer_on)
            uv_timer_stop(&l->timer);
        l->timer_on = 0;
        return;
    }
    if (l->timer_on)
        return;
    l->last_in = bytes_in(l);
    l->timer_on = 1;
    uv_timer_start(&l->timer, on_link_timer, tick_ms(l), tick_ms(l));
}

static void fail_queue(struct chan *l, struct lopq *q, int all, uint64_t seq, const err *e)
{
    struct lop *op, *prev = NULL, *next;
    for (op = q->head; op; op = next) {
        next = op->next;
        if (!all && op->seq != seq) {
            prev = op;
            continue;
        }
        if (op->kind == LOP_SEND && op->issued) {
            /* libuv still writes from its buffer: report when the write is done */
            if (!op->failed && (op->fail = malloc(sizeof *op->fail)) != NULL)
                *op->fail = *e;
            op->failed = 1;
            prev = op;
            continue;
        }
        if (prev)
            prev->next = next;
        else
            q->head = next;
        if (q->tail == op)
            q->tail = prev;
        if (!op->fail && (op->fail = malloc(sizeof *op->fail)) != NULL)
            *op->fail = *e;
        chan_defer(l->p, op);
    }
}

static int has_issued(const struct chan *l)
{
    for (const struct lop *op = l->sq.head; op; op = op->next)
        if (op->issued)
            return 1;
    return 0;
}

void chan_fail_seq(struct chan *l, uint64_t seq, const err *e)
{
    if (l->closing)
        return;
    if (l->rq.head && l->rq.head->seq == seq && l->rx.ops && l->rx.ops->discard)
        l->rx.ops->discard(l); /* it may be reading into the head's buffer */
    fail_queue(l, &l->rq, 0, seq, e);
    fail_queue(l, &l->hq, 0, seq, e);
    fail_queue(l, &l->sq, 0, seq, e);
    if (has_issued(l) && !l->grace_until) {
        /* writes of the failed collective in flight: give the peer a little
         * while to take them (it discards them), then cut the connection */
        l->grace_until = uv_now(l->p->loop) + l->p->timeout_ms / 4 + 1;
    }
    chan_arm(l);
}

int chan_queue_abort(struct chan *l, uint64_t seq, const err *e)
{
    unsigned i;
    if (!l->aborts && !(l->aborts = calloc(CHAN_ABORTS_MAX, sizeof *l->aborts)))
        return -1;
    for (i = 0; i < l->naborts; i++)
        if (l->aborts[i].seq == seq)
            return 0;
    i = l->naborts < CHAN_ABORTS_MAX ? l->naborts++ : CHAN_ABORTS_MAX - 1;
    l->aborts[i].seq = seq;
    l->aborts[i].issued = 0;
    l->aborts[i].e = *e;
    return 0;
}

/* The peer itself is gone or hung: cut both halves at once. */
void chan_fail(struct chan *l, uint64_t seq, const err *e)
{
    if (l->closing)
        return;
    if (l->rx.ops && l->rx.ops->discard)
        l->rx.ops->discard(l);
    fail_queue(l, &l->rq, 1, 0, e);
    fail_queue(l, &l->hq, 1, 0, e);
    fail_queue(l, &l->sq, 1, 0, e);
    close_halves(l); /* issued writes complete (cancelled) from the loop */
    l->linger_until = 0;
    chan_arm(l);
    l->p->fail_seq(l->p, seq, e, 1, l->replica);
}

static void chunk_err(struct chan *l, const struct lop *op, err *e, const char *shape)
{
    const struct peers *p = l->p;
    if (strcmp(shape, "never") == 0 && p->machine_cpus &&
        p->machine_cores > (uint64_t)MACHINE_CORES_PER_CPU * p->machine_cpus)
        /* the peer may be alive but not get to run: say so, with the numbers */
        err_set(e, CODE_UNAVAILABLE,
                "core %s sent nothing for chunk %u of %s #%llu in %u ms and did not answer a probe in %u ms: "
                "it is gone, or its machine is too overloaded to keep even these times (a machine of the "
                "cluster runs %u emulated cores on %u CPUs); run fewer cores per machine or give them more "
                "CPUs", l->name, op->chunk, op->what, (unsigned long long)op->seq, p->timeout_ms, p->probe_ms,
                p->machine_cores, p->machine_cpus);
    else if (strcmp(shape, "never") == 0)
        err_set(e, CODE_UNAVAILABLE, "core %s never sent chunk %u of %s #%llu", l->name, op->chunk,
                op->what, (unsigned long long)op->seq);
    else
        err_set(e, CODE_UNAVAILABLE,
                "core %s did not take chunk %u of %s #%llu for %u ms (it hangs or is cut off)", l->name,
                op->chunk, op->what, (unsigned long long)op->seq, l->p->timeout_ms);
}

/* The verdict of a probe started by on_link_timer. */
static void on_probe(void *arg, int alive)
{
    struct chan *l = arg;
    struct lop *head;
    err e;

    l->probe = NULL;
    head = l->rq.head ? l->rq.head : l->sq.head;
    if (!l->closing && head) {
        if (alive) {
            /* slow, not gone: wait another round, remembering since when */
            if (!l->silent_since)
                l->silent_since = l->last_progress;
            l->last_progress = uv_now(l->p->loop);
            log_debug("silent collective peer answered its probe", "peer=%s", log_q(l->name));
        } else {
            chunk_err(l, head, &e, l->rq.head ? "never" : "take");
            log_warn("collective peer is gone", "peer=%s reason=%s", log_q(l->name), log_q(e.msg));
            chan_fail(l, head->seq, &e);
        }
    }
    chan_unref(l);
}

/* Starts a probe of l's peer; 0 if it cannot start (the caller blames at once). */
static int start_probe(struct chan *l)
{
    const struct peertab *t = l->p->tab;
    size_t r = (size_t)l->replica;
    char ctl[PEERTAB_MAX_ADDR + 1];
    err e;

    l->probe = probe_start(l->p->loop, l->p->auth, l->p->id->sender, peertab_control_addr(t, r, ctl, sizeof ctl),
                           peertab_host(t, r), peertab_core(t, r), peertab_incarnation(t, r), l->p->probe_ms,
                           on_probe, l, &e);
    if (!l->probe) {
        log_warn("cannot probe a silent collective peer", "peer=%s reason=%s", log_q(l->name),
                 log_q(e.msg));
        return 0;
    }
    l->refs++;
    return 1;
}

static void on_link_timer(uv_timer_t *t)
{
    struct chan *l = t->data;
    uint64_t now = uv_now(l->p->loop), in = bytes_in(l);
    err e;

    if (l->closing)
        return;
    if (in != l->last_in) {
        l->last_in = in;
        l->last_progress = now;
        l->silent_since = 0;
    }
    if (l->linger_until && now >= l->linger_until) {
        /* no ABORT came: the connection loss itself is the cause */
        err le = l->linger_err ? *l->linger_err : (err){CODE_UNAVAILABLE, "connection lost"};
        struct lop *head = l->rq.head ? l->rq.head : l->sq.head;
        l->linger_until = 0;
        if (head) {
            chan_fail(l, head->seq, &le);
            return;
        }
    }
    if (l->grace_until && now >= l->grace_until) {
        l->grace_until = 0;
        if (has_issued(l) && l->tx.ops && l->tx.ops->unstick)
            l->tx.ops->unstick(l);
    }
    if (!l->rq.head && !l->sq.head)
        l->silent_since = 0;
    if (l->lf && l->p->faults->partitioned(l, now, &e)) {
        /* the link is cut, not the peer: no probe, and the connections stay
         * for after the partition; the ABORT goes to the peer too (it is
         * not held), so that it fails with this cause, not a later one */
        struct lop *head = l->hq.head ? l->hq.head : l->rq.head;
        log_warn("collective peer cut off by a partition", "peer=%s reason=%s", log_q(l->name), log_q(e.msg));
        l->p->fail_seq(l->p, head->seq, &e, 1, -1);
        chan_arm(l);
        return;
    }
    if ((l->rq.head || l->sq.head) && now - l->last_progress >= l->p->timeout_ms && !l->probe) {
        struct lop *head = l->rq.head ? l->rq.head : l->sq.head;
        int failed_only = 1;
        for (const struct lop *op = l->sq.head; op; op = op->next)
            if (!op->failed)
                failed_only = 0;
        if (l->silent_since && now - l->silent_since >= l->p->stall_ms) {
            err_set(&e, CODE_UNAVAILABLE,
                    "core %s is alive but sent nothing for chunk %u of %s #%llu in %.1f s; did every "
                    "core get the collective from its client?", l->name, head->chunk, head->what,
                    (unsigned long long)head->seq, (double)(now - l->silent_since) / 1000.0);
            log_warn("collective peer stalled", "peer=%s reason=%s", log_q(l->name), log_q(e.msg));
            chan_fail(l, head->seq, &e);
            return;
        }
        if ((l->rq.head || !failed_only) && start_probe(l)) {
            chan_arm(l);
            return;
        }
        if (l->rq.head || !failed_only) {
            chunk_err(l, head, &e, l->rq.head ? "never" : "take");
            log_warn("collective peer made no progress", "peer=%s reason=%s", log_q(l->name), log_q(e.msg));
            chan_fail(l, head->seq, &e);
            return;
        }
    }
    chan_arm(l); /* stops the timer when nothing is left */
}

static struct lop *new_op(struct chan *l, enum lop_kind kind, const struct xport_chunk *c, const void *buf,
                          size_t len, xport_cb cb, void *arg)
{
    struct lop *op = calloc(1, sizeof *op);
    if (!op)
        return NULL;
    op->l = l;
    op->kind = kind;
    op->seq = c->seq;
    op->step = c->step;
    op->chunk = c->chunk;
    op->offset = c->offset;
    op->what = c->what ? c->what : "collective";
    op->buf = (uint8_t *)buf;
    op->len = len;
    op->cb = cb;
    op->arg = arg;
    op->t_post = uv_hrtime();
    l->p->cur_seq = c->seq;
    l->p->cur_what = op->what;
    return op;
}

void chan_trace_done(struct chan *l, const struct lop *op)
{
    struct trace *t = l->p->trace;
    struct trace_ev ev;
    if (!trace_capacity(t))
        return;
    memset(&ev, 0, sizeof ev);
    ev.kind = op->kind == LOP_SEND ? TPUEMU__TRACE_KIND__TRACE_SEND : TPUEMU__TRACE_KIND__TRACE_RECV;
    ev.t0 = op->t_post;
    ev.dur = uv_hrtime() - op->t_post;
    ev.bytes = op->len;
    ev.seq = op->seq;
    ev.coll_step = op->step;
    ev.chunk = op->chunk;
    ev.peer = l->replica;
    {
        const struct chan_ops *o = op->kind == LOP_SEND ? l->tx.ops : l->rx.ops;
        memcpy(ev.algo, o ? o->name : "tcp", 4); /* "shm", "tcp" */
    }
    trace_add(t, &ev);
}

/* Fails op at once (deferred) if its collective already failed. */
static int already_failed(struct chan *l, struct lop *op)
{
    err e;
    if (chan_seq_failed(l->p, op->seq, &e) == CODE_OK)
        return 0;
    if ((op->fail = malloc(sizeof *op->fail)) != NULL)
        *op->fail = e;
    chan_defer(l->p, op);
    return 1;
}

static int check_args(const struct chan *l, const struct xport_chunk *c, const void *buf, size_t len)
{
    if (!l || !c || l->closing || (len > 0 && !buf))
        return CODE_INVALID_ARGUMENT;
    if (len > XPORT_MAX_CHUNK)
        return CODE_INVALID_ARGUMENT;
    return CODE_OK;
}

static void shm_fallback_log(struct chan *l, const char *why)
{
    if (!l->p->shm_fallback_logged) {
        l->p->shm_fallback_logged = 1;
        log_warn("shared memory unavailable; using TCP", "peer=%s reason=%s", log_q(l->name), log_q(why));
    }
}

/* The outgoing half's transport, chosen at its first send: shared memory
 * with a same-host peer that offers it, else TCP (also when the set-up
 * cannot start, or fails later: chan_tx_failed). The only place a channel's
 * sends get their transport. */
static void pick_tx(struct chan *l)
{
    struct peers *p = l->p;
    err e;

    if (!p->tcp_only && p->shm && peers_same_host_shm(p, l->replica)) {
        l->tx.ops = p->shm_tx;
        l->tx.st = NULL;
        if (l->tx.ops->start(l, &e) == CODE_OK)
            return; /* the sends wait for chan_tx_ready or chan_tx_failed */
        shm_fallback_log(l, e.msg);
    }
    l->tx.ops = p->tcp_tx;
    l->tx.st = NULL;
}

void chan_tx_ready(struct chan *l)
{
    chan_progress(l);
    l->tx.ops->kick(l);
}

void chan_tx_lost(struct chan *l)
{
    l->tx.ops = l->p->tcp_tx;
    l->tx.st = NULL;
}

void chan_tx_failed(struct chan *l, const char *why)
{
    if (l->closing)
        return;
    if (why)
        shm_fallback_log(l, why);
    chan_tx_lost(l);
    l->tx.ops->kick(l);
}

void chan_rx_use(struct chan *l, const struct chan_ops *ops, void *st)
{
    if (l->rx.ops == ops && l->rx.st == st)
        return;
    if (l->rx.ops)
        l->rx.ops->close(l);
    l->rx.ops = ops;
    l->rx.st = st;
}

void chan_rx_lost(struct chan *l, const void *st)
{
    if (l->rx.st == st) {
        l->rx.ops = NULL;
        l->rx.st = NULL;
    }
}

void chan_aborted(struct chan *l, uint64_t seq, const err *e)
{
    l->p->fail_seq(l->p, seq, e, 0, -1);
}

int chan_send(struct chan *l, const struct xport_chunk *c, const void *buf, size_t len, xport_cb cb, void *arg)
{
    struct lop *op;
    int rc = check_args(l, c, buf, len);

    if (rc != CODE_OK)
        return rc;
    if (!(op = new_op(l, LOP_SEND, c, buf, len, cb, arg)))
        return CODE_RESOURCE_EXHAUSTED;
    if (already_failed(l, op))
        return CODE_OK;
    if (!l->sq.head && !l->rq.head && !l->hq.head)
        chan_progress(l); /* the clock starts when the link gets busy */
    if (l->holding)
        l->p->faults->send(l, op); /* a link fault (hold.c) */
    else
        chan_send_now(l, op);
    return CODE_OK;
}

void chan_send_now(struct chan *l, struct lop *op)
{
    lopq_push(&l->sq, op);
    chan_arm(l);
    if (!l->tx.ops)
        pick_tx(l);     /* the first send */
    l->tx.ops->kick(l); /* now, or once the half is ready */
}

int chan_recv(struct chan *l, const struct xport_chunk *c, void *buf, size_t len, xport_cb cb, void *arg)
{
    return chan_recv_reduce(l, c, buf, len, NULL, NULL, cb, arg);
}

int chan_recv_reduce(struct chan *l, const struct xport_chunk *c, void *buf, size_t len, xport_reduce_fn red,
                     void *red_arg, xport_cb cb, void *arg)
{
    struct lop *op;
    int rc = check_args(l, c, buf, len);

    if (rc != CODE_OK)
        return rc;
    if (!(op = new_op(l, LOP_RECV, c, buf, len, cb, arg)))
        return CODE_RESOURCE_EXHAUSTED;
    op->red = red;
    op->red_arg = red_arg;
    if (already_failed(l, op))
        return CODE_OK;
    if (!l->sq.head && !l->rq.head)
        chan_progress(l);
    lopq_push(&l->rq, op);
    chan_arm(l);
    chan_spin(l->p);
    if (l->rq.head == op && l->rx.ops)
        l->rx.ops->kick(l);
    return CODE_OK;
}
