/* link: the transport-independent half of a link to one peer replica: the
 * ordered queues of pending sends and receives, the one progress timer per
 * link, and failures with the messages users see ("core host1/3 never sent
 * chunk 5 of all-reduce #812"). The bytes move in link_tcp.c or shm.c. */
#include "link_impl.h"
#include "trace.h"
#include "worker.h"
#include "probe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "worker.h"

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

static void on_link_timer(uv_timer_t *t);

struct link *link_new(struct peers *p, int r)
{
    struct link *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->p = p;
    l->replica = r;
    snprintf(l->name, sizeof l->name, "%s/%d", p->info[r].host, p->info[r].core);
    snprintf(l->data_addr, sizeof l->data_addr, "%s", p->info[r].data_addr);
    uv_timer_init(p->loop, &l->timer);
    l->timer.data = l;
    l->refs = 1;
    return l;
}

void link_unref(struct link *l)
{
    if (--l->refs > 0)
        return;
    free(l->aborts);
    free(l->linger_err);
    free(l);
}

static void on_timer_closed(uv_handle_t *h)
{
    link_unref(h->data);
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

void link_destroy(struct link *l)
{
    if (l->closing)
        return;
    l->closing = 1;
    drop_queue(&l->rq, 0);
    if (l->out)
        dp_conn_close(l->out, NULL); /* writes stop now; their callbacks free issued ops */
    drop_queue(&l->sq, 1);
    if (l->in)
        dp_conn_close(l->in, NULL);
    shm_close(l);
    if (l->probe) {
        probe_cancel(l->probe);
        l->probe = NULL;
        link_unref(l);
    }
    uv_timer_stop(&l->timer);
    uv_close((uv_handle_t *)&l->timer, on_timer_closed);
}

const char *link_peer_name(const struct link *l)
{
    return l->name;
}

int link_peer_replica(const struct link *l)
{
    return l->replica;
}

int link_is_shm(const struct link *l)
{
    return l->tx != NULL || l->rx != NULL;
}

static uint64_t bytes_in(const struct link *l)
{
    return (l->in ? dp_conn_bytes_read(l->in) : 0) + shm_bytes_in(l);
}

void link_progress(struct link *l)
{
    l->last_progress = uv_now(l->p->loop);
    l->silent_since = 0;
}

/* The progress check runs every timeout/8 (5..250 ms) while anything is
 * pending (or a grace/linger deadline is set): a failure is seen at most
 * timeout + one period after the last byte moved. */
static unsigned tick_ms(const struct link *l)
{
    unsigned t = l->p->timeout_ms / 8;
    return t < 5 ? 5 : t > 250 ? 250 : t;
}

void link_arm(struct link *l)
{
    if (l->closing)
        return;
    if (!l->sq.head && !l->rq.head && !l->grace_until && !l->linger_until) {
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

static void fail_queue(struct link *l, struct lopq *q, int all, uint64_t seq, const err *e)
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
        peers_defer(l->p, op);
    }
}

static int has_issued(const struct link *l)
{
    for (const struct lop *op = l->sq.head; op; op = op->next)
        if (op->issued)
            return 1;
    return 0;
}

void link_fail_seq(struct link *l, uint64_t seq, const err *e)
{
    if (l->closing)
        return;
    if (l->rq.head && l->in && l->rq.head->seq == seq)
        dp_conn_discard_current(l->in); /* it may be reading into the head's buffer */
    fail_queue(l, &l->rq, 0, seq, e);
    fail_queue(l, &l->sq, 0, seq, e);
    if (has_issued(l) && !l->grace_until) {
        /* writes of the failed collective in flight: give the peer a little
         * while to take them (it discards them), then cut the connection */
        l->grace_until = uv_now(l->p->loop) + l->p->timeout_ms / 4 + 1;
    }
    link_arm(l);
}

int link_queue_abort(struct link *l, uint64_t seq, const err *e)
{
    unsigned i;
    if (!l->aborts && !(l->aborts = calloc(LINK_ABORTS_MAX, sizeof *l->aborts)))
        return -1;
    for (i = 0; i < l->naborts; i++)
        if (l->aborts[i].seq == seq)
            return 0;
    i = l->naborts < LINK_ABORTS_MAX ? l->naborts++ : LINK_ABORTS_MAX - 1;
    l->aborts[i].seq = seq;
    l->aborts[i].issued = 0;
    l->aborts[i].e = *e;
    return 0;
}

/* The peer itself is gone or hung: cut both halves at once. */
void link_fail(struct link *l, uint64_t seq, const err *e)
{
    if (l->closing)
        return;
    if (l->in)
        dp_conn_discard_current(l->in);
    if (l->out) {
        dp_conn *c = l->out;
        l->out = NULL;
        l->out_ready = 0;
        dp_conn_close(c, NULL); /* issued writes complete (cancelled) from the loop */
    }
    fail_queue(l, &l->rq, 1, 0, e);
    fail_queue(l, &l->sq, 1, 0, e);
    if (l->in) {
        dp_conn *c = l->in;
        l->in = NULL;
        dp_conn_close(c, NULL);
    }
    shm_close(l);
    l->linger_until = 0;
    link_arm(l);
    peers_fail_seq(l->p, seq, e, 1, l->replica);
}

static void chunk_err(struct link *l, const struct lop *op, err *e, const char *shape)
{
    if (strcmp(shape, "never") == 0)
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
    struct link *l = arg;
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
            link_fail(l, head->seq, &e);
        }
    }
    link_unref(l);
}

/* Starts a probe of l's peer; 0 if it cannot start (the caller blames at once). */
static int start_probe(struct link *l)
{
    const struct peer_info *pi = &l->p->info[l->replica];
    struct worker *w = l->p->w;
    err e;

    l->probe = probe_start(l->p->loop, &w->auth, worker_sender(w), pi->control_addr, pi->incarnation,
                           l->p->probe_ms, on_probe, l, &e);
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
    struct link *l = t->data;
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
            link_fail(l, head->seq, &le);
            return;
        }
    }
    if (l->grace_until && now >= l->grace_until) {
        l->grace_until = 0;
        if (has_issued(l) && l->out) {
            dp_conn *c = l->out;
            l->out = NULL;
            l->out_ready = 0;
            log_info("cutting a stuck data-plane connection after a failure", "peer=%s", log_q(l->name));
            dp_conn_close(c, NULL);
            if (l->naborts) {
                err de;
                for (unsigned i = 0; i < l->naborts; i++)
                    l->aborts[i].issued = 0;
                if (tcp_dial(l, &de) != CODE_OK)
                    l->naborts = 0;
            }
        }
    }
    if (!l->rq.head && !l->sq.head)
        l->silent_since = 0;
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
            link_fail(l, head->seq, &e);
            return;
        }
        if ((l->rq.head || !failed_only) && start_probe(l)) {
            link_arm(l);
            return;
        }
        if (l->rq.head || !failed_only) {
            chunk_err(l, head, &e, l->rq.head ? "never" : "take");
            log_warn("collective peer made no progress", "peer=%s reason=%s", log_q(l->name), log_q(e.msg));
            link_fail(l, head->seq, &e);
            return;
        }
    }
    link_arm(l); /* stops the timer when nothing is left */
}

static struct lop *new_op(struct link *l, enum lop_kind kind, const struct link_chunk *c, const void *buf,
                          size_t len, link_cb cb, void *arg)
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

void link_trace_done(struct link *l, const struct lop *op)
{
    struct trace *t = l->p->w->trace;
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
    memcpy(ev.algo, l->tx || l->rx ? "shm" : "tcp", 4);
    trace_add(t, &ev);
}

/* Fails op at once (deferred) if its collective already failed. */
static int already_failed(struct link *l, struct lop *op)
{
    err e;
    if (peers_failed(l->p, op->seq, &e) == CODE_OK)
        return 0;
    if ((op->fail = malloc(sizeof *op->fail)) != NULL)
        *op->fail = e;
    peers_defer(l->p, op);
    return 1;
}

static int check_args(const struct link *l, const struct link_chunk *c, const void *buf, size_t len)
{
    if (!l || !c || l->closing || (len > 0 && !buf))
        return CODE_INVALID_ARGUMENT;
    if (len > LINK_MAX_FRAME)
        return CODE_INVALID_ARGUMENT;
    return CODE_OK;
}

int link_send(struct link *l, const struct link_chunk *c, const void *buf, size_t len, link_cb cb, void *arg)
{
    struct lop *op;
    err e;
    int rc = check_args(l, c, buf, len);

    if (rc != CODE_OK)
        return rc;
    if (!(op = new_op(l, LOP_SEND, c, buf, len, cb, arg)))
        return CODE_RESOURCE_EXHAUSTED;
    if (already_failed(l, op))
        return CODE_OK;
    if (!l->sq.head && !l->rq.head)
        link_progress(l); /* the clock starts when the link gets busy */
    lopq_push(&l->sq, op);
    link_arm(l);
    if (l->tx) {
        shm_kick_tx(l);
        return CODE_OK;
    }
    if (l->shm_dialing)
        return CODE_OK; /* shm_connect's end kicks the queue, or TCP takes it */
    if (l->out) {
        if (l->out_ready)
            tcp_issue_sends(l);
        return CODE_OK;
    }
    /* first send (or the connection went away between collectives) */
    if (!l->shm_tried && !l->p->tcp_only && l->p->shm && l->p->info[l->replica].shm_name[0] &&
        strcmp(l->p->info[l->replica].host, l->p->info[l->p->self].host) == 0) {
        l->shm_tried = 1;
        if (shm_connect(l, &e) == CODE_OK)
            return CODE_OK;
        if (!l->p->shm_fallback_logged) {
            l->p->shm_fallback_logged = 1;
            log_warn("shared memory unavailable; using TCP", "peer=%s reason=%s", log_q(l->name),
                     log_q(e.msg));
        }
    }
    if (tcp_dial(l, &e) != CODE_OK) {
        err fe;
        err_set(&fe, CODE_UNAVAILABLE, "cannot reach core %s for chunk %u of %s #%llu: %s", l->name,
                op->chunk, op->what, (unsigned long long)op->seq, e.msg);
        link_fail(l, op->seq, &fe);
    }
    return CODE_OK;
}

int link_recv(struct link *l, const struct link_chunk *c, void *buf, size_t len, link_cb cb, void *arg)
{
    struct lop *op;
    int rc = check_args(l, c, buf, len);

    if (rc != CODE_OK)
        return rc;
    if (!(op = new_op(l, LOP_RECV, c, buf, len, cb, arg)))
        return CODE_RESOURCE_EXHAUSTED;
    if (already_failed(l, op))
        return CODE_OK;
    if (!l->sq.head && !l->rq.head)
        link_progress(l);
    lopq_push(&l->rq, op);
    link_arm(l);
    if (l->rq.head == op) {
        if (l->rx)
            shm_kick_rx(l);
        if (l->in)
            tcp_recv_posted(l);
    }
    return CODE_OK;
}
