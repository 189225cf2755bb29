/* chan_tcp: the TCP transport of a channel, over data-plane connections
 * (dpconn.h): the ops of a channel's halves when TCP moves their chunks
 * (chan_tcp_tx, chan_tcp_rx) and of its ctl (chan_tcp_ctl), which owns the
 * two connections: ABORTs go and come on them whichever transport moves the
 * chunks. The outgoing connection is our dial to the peer; the incoming one
 * is the peer's dial to us.
 * Sends are written straight from the caller's buffer (dp_conn_send_ref: not
 * counted against the copy cap, the collective bounds them); a CHUNK's payload
 * is read straight into the posted receive's buffer, and while no receive is
 * posted reading pauses, so the kernel's socket buffers push back on the
 * sender. ABORT frames travel on the outgoing half too. */
#include "chan_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"
#include "log.h"
#include "tuning.h"

#define ABORT_MSG_MAX 600
/* Dialing a peer gets the failure bound (heartbeat x dead-after), at least
 * DIAL_MS_MIN. It was capped at 5 s: with 1,024 workers on 2 CPUs (bound 32 s)
 * a peer's loop took longer than that to accept, and the all-reduce failed
 * with every core alive. */
#define DIAL_MS_MAX 120000u
#define DIAL_MS_MIN 1000u

static const err ok_err = {CODE_OK, ""};

/* The channel's TCP state (its ctl.st; a TCP half's st is the same). */
struct tcp_link {
    dp_conn *out; /* our dial to the peer (lazy) */
    int out_ready;
    dp_conn *in;   /* the peer's dial to us */
    int in_cut;    /* an incoming connection was lost or replaced since the last
                      chunk that arrived as expected: chunks may be lost */
    uint8_t *rtmp; /* where a reducing receive's payload lands first */
    size_t rtmp_len;
};

static struct tcp_link *tl(const struct chan *l)
{
    return l->ctl.st;
}

static int tcp_dial(struct chan *l, err *e);
static void tcp_send_abort(struct chan *l);

static void lost_err(struct chan *l, const struct lop *op, err *e)
{
    err_set(e, CODE_UNAVAILABLE,
            "core %s closed its connection during chunk %u of %s #%llu (the process died or was cut off)",
            l->name, op->chunk, op->what, (unsigned long long)op->seq);
}

/* ---- outgoing half ---- */

static void on_sent(void *arg, int status)
{
    struct lop *op = arg, *x, *prev = NULL;
    struct chan *l = op->l;
    err e;

    if (!l) { /* the link was reset */
        free(op->fail);
        free(op);
        return;
    }
    for (x = l->sq.head; x && x != op; x = x->next)
        prev = x;
    if (x) {
        if (prev)
            prev->next = op->next;
        else
            l->sq.head = op->next;
        if (l->sq.tail == op)
            l->sq.tail = prev;
    }
    if (status == 0 && !op->failed) {
        chan_progress(l);
        chan_trace_done(l, op);
        op->cb(op->arg, &ok_err);
        free(op);
        chan_arm(l);
        return;
    }
    if (!op->failed) {
        lost_err(l, op, &e);
        chan_fail(l, op->seq, &e);
        op->cb(op->arg, &e);
    } else {
        op->cb(op->arg, op->fail ? op->fail : &e);
    }
    free(op->fail);
    free(op);
    if (!l->closing)
        chan_arm(l);
}

static void tcp_issue_sends(struct chan *l)
{
    struct tcp_link *t = tl(l);
    if (l->tx.ops != &chan_tcp_tx)
        return; /* chunks go through another transport; TCP carries ABORTs only */
    for (struct lop *op = l->sq.head; op && t->out && t->out_ready; op = op->next) {
        Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
        if (op->issued)
            continue;
        h.kind = TPUEMU__FRAME_KIND__FRAME_CHUNK;
        h.epoch = l->p->epoch;
        h.seq = op->seq;
        h.step = op->step;
        h.chunk = op->chunk;
        h.offset = op->offset;
        if (dp_conn_send_ref(t->out, &h, op->buf, op->len, on_sent, op) != CODE_OK)
            return; /* closing: on_close fails what is left */
        op->issued = 1;
    }
}

struct abort_sent {
    struct chan *l;
    uint64_t seq;
};

/* An ABORT's write completed: drop it from the queue, or (the connection was
 * cut) leave it for the next one. */
static void on_abort_sent(void *arg, int status)
{
    struct abort_sent *a = arg;
    struct chan *l = a->l;
    for (unsigned i = 0; i < l->naborts; i++) {
        if (l->aborts[i].seq != a->seq)
            continue;
        if (status == 0) {
            memmove(&l->aborts[i], &l->aborts[i + 1], (l->naborts - i - 1) * sizeof *l->aborts);
            l->naborts--;
        } else {
            l->aborts[i].issued = 0;
        }
        break;
    }
    free(a);
    if (status != 0 && !l->closing)
        tcp_send_abort(l);
    chan_unref(l);
}

static void tcp_send_abort(struct chan *l)
{
    struct tcp_link *t = tl(l);
    for (unsigned i = 0; i < l->naborts && t->out && t->out_ready; i++) {
        Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
        Tpuemu__Status st = TPUEMU__STATUS__INIT;
        char msg[ABORT_MSG_MAX];
        struct chan_abort *q = &l->aborts[i];
        struct abort_sent *a;

        if (q->issued || !(a = malloc(sizeof *a)))
            continue;
        snprintf(msg, sizeof msg, "%.*s", (int)sizeof msg - 1, q->e.msg);
        st.code = (Tpuemu__Code)q->e.code;
        st.message = msg;
        h.kind = TPUEMU__FRAME_KIND__FRAME_ABORT;
        h.epoch = l->p->epoch;
        h.seq = q->seq;
        h.status = &st;
        a->l = l;
        a->seq = q->seq;
        l->refs++;
        q->issued = 1;
        if (dp_conn_send(t->out, &h, NULL, 0, on_abort_sent, a) != CODE_OK) {
            /* closing: its on_close runs; nothing more to write here */
            q->issued = 0;
            l->refs--;
            free(a);
            l->naborts = 0;
            return;
        }
    }
}

static void out_ready(dp_conn *c)
{
    struct chan *l = dp_conn_data(c);
    if (l->closing || tl(l)->out != c)
        return;
    tl(l)->out_ready = 1;
    chan_progress(l);
    tcp_send_abort(l);
    tcp_issue_sends(l);
}

static void out_frame(dp_conn *c, const Tpuemu__FrameHeader *h, uint8_t *payload, size_t len)
{
    (void)len;
    free(payload);
    dp_conn_fail(c, CODE_INVALID_ARGUMENT, "unexpected frame of kind %d on a collective's outgoing link",
                 (int)h->kind);
}

static void out_close(dp_conn *c, const err *why)
{
    struct chan *l = dp_conn_data(c);
    struct tcp_link *t = tl(l);
    int was_ready = 0;
    err e;

    if (t->out == c) {
        was_ready = t->out_ready;
        t->out = NULL;
        t->out_ready = 0;
        if (!l->closing && l->sq.head && l->tx.ops == &chan_tcp_tx) {
            struct lop *op = l->sq.head;
            if (was_ready)
                lost_err(l, op, &e);
            else
                err_set(&e, CODE_UNAVAILABLE, "cannot reach core %s at %s for chunk %u of %s #%llu: %s",
                        l->name, l->data_addr, op->chunk, op->what, (unsigned long long)op->seq,
                        why->code != CODE_OK ? why->msg : "the connection closed");
            chan_fail(l, op->seq, &e);
        }
    }
    chan_unref(l);
}

static int tcp_dial(struct chan *l, err *e)
{
    struct dp_conn_cfg cfg;
    struct sockaddr_storage ss;
    addr a;
    dp_conn *c;

    if (addr_parse(l->data_addr, 0, &a, e) != CODE_OK)
        return e->code;
    memset(&ss, 0, sizeof ss);
    if (uv_ip4_addr(a.host, a.port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(a.host, a.port, (struct sockaddr_in6 *)&ss) != 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "data address '%s' is not an IP address and port",
                       l->data_addr);
    memset(&cfg, 0, sizeof cfg);
    cfg.auth = l->p->auth;
    cfg.self_name = l->p->id->sender;
    cfg.max_payload = 0;
    cfg.max_pending_write = DP_MAX_PENDING;
    /* A connection handshake is not progress of a collective: give it room on a
     * loaded machine (a hung peer is still caught by the probe and the bound). */
    cfg.handshake_ms = 2 * l->p->timeout_ms < DIAL_MS_MIN ? DIAL_MS_MIN
                       : 2 * l->p->timeout_ms > DIAL_MS_MAX ? DIAL_MS_MAX
                                                            : 2 * l->p->timeout_ms;
    cfg.on_ready = out_ready;
    cfg.on_frame = out_frame;
    cfg.on_close = out_close;
    cfg.data = l;
    cfg.replica = l->p->self;
    cfg.epoch = l->p->epoch;
    if (dp_conn_connect(l->p->loop, (struct sockaddr *)&ss, &cfg, &c, e) != CODE_OK)
        return e->code;
    l->refs++;
    tl(l)->out = c;
    tl(l)->out_ready = 0;
    return CODE_OK;
}

/* ---- incoming half ---- */

/* --test-lose-chunk (tuning.h): is this chunk from l's peer the one to lose?
 * Loop thread only; it fires once per process. */
static int lose_this_chunk(const struct chan *l)
{
    static unsigned long seen, nth;
    static int state; /* 0: not read yet, 1: armed, 2: off or done */
    static char peer[300];

    if (state == 0)
        state = tuning_lose_chunk(tuning_get()->test_lose_chunk, peer, sizeof peer, &nth) == 1 ? 1 : 2;
    if (state != 1 || strcmp(l->name, peer) != 0 || ++seen < nth)
        return 0;
    state = 2;
    return 1;
}

/* Does h match a receive posted after the head one? Then the chunks before
 * it were lost on the way: both ends put the chunks of a link in one order. */
static const struct lop *posted_later(const struct chan *l, const Tpuemu__FrameHeader *h)
{
    for (const struct lop *op = l->rq.head ? l->rq.head->next : NULL; op; op = op->next)
        if (h->seq == op->seq && h->step == op->step && h->chunk == op->chunk && h->offset == op->offset &&
            h->payload_bytes == op->len)
            return op;
    return NULL;
}

static enum dp_buf in_payload_buf(dp_conn *c, const Tpuemu__FrameHeader *h, void **buf)
{
    struct chan *l = dp_conn_data(c);
    struct tcp_link *t = tl(l);
    struct lop *op;
    err e;

    if (l->closing || t->in != c)
        return DP_BUF_DISCARD;
    if (h->kind == TPUEMU__FRAME_KIND__FRAME_ABORT && h->payload_bytes == 0)
        return DP_BUF_MALLOC;
    if (h->kind != TPUEMU__FRAME_KIND__FRAME_CHUNK || h->epoch != l->p->epoch) {
        dp_conn_fail(c, CODE_INVALID_ARGUMENT,
                     "a collective's link carries CHUNK and ABORT frames of epoch %llu only (got kind %d "
                     "of epoch %llu)", (unsigned long long)l->p->epoch, (int)h->kind,
                     (unsigned long long)h->epoch);
        return DP_BUF_FAILED;
    }
    chan_rx_use(l, &chan_tcp_rx, t); /* the peer's chunks come by TCP */
    op = l->rq.head;
    if (lose_this_chunk(l)) {
        log_warn("a data-plane chunk is lost on purpose (--test-lose-chunk)", "peer=%s seq=%llu step=%llu chunk=%u",
                 log_q(l->name), (unsigned long long)h->seq, (unsigned long long)h->step, h->chunk);
        return DP_BUF_DISCARD;
    }
    if (chan_seq_failed(l->p, h->seq, &e) != CODE_OK)
        return DP_BUF_DISCARD; /* the rest of a failed collective */
    if (!op)
        return DP_BUF_WAIT;
    if (h->seq < op->seq)
        return DP_BUF_DISCARD;
    if (h->seq == op->seq && h->step == op->step && h->chunk == op->chunk && h->offset == op->offset &&
        h->payload_bytes == op->len) {
        t->in_cut = 0;
        if (op->red && op->len > t->rtmp_len) { /* reduced from a buffer of the link's (in_frame) */
            uint8_t *nb = realloc(t->rtmp, op->len);
            if (!nb) {
                err_set(&e, CODE_RESOURCE_EXHAUSTED, "out of memory receiving chunk %u of %s #%llu from core %s",
                        op->chunk, op->what, (unsigned long long)op->seq, l->name);
                chan_fail(l, op->seq, &e);
                return DP_BUF_FAILED;
            }
            t->rtmp = nb;
            t->rtmp_len = op->len;
        }
        *buf = op->red ? t->rtmp : op->buf;
        return DP_BUF_INTO;
    }
    if (!t->in_cut && h->seq > op->seq) {
        /* a chunk of a later collective: the peer is done with this one (a
         * send completes once written, and the peer had every chunk it needed
         * from this core), so what it sent this core for it was lost on the
         * way (a cut connection, a ring left behind). Not a disagreement: the
         * collective fails UNAVAILABLE on every core, as a lost chunk does,
         * and the later one's chunks are thrown away as they come. */
        err_set(&e, CODE_UNAVAILABLE,
                "chunk %u (step %u) of %s #%llu from core %s to core %s/%d was lost on the way: core %s went on "
                "to #%llu and sent its chunk %u (step %llu) in its place",
                op->chunk, op->step, op->what, (unsigned long long)op->seq, l->name, l->p->id->host_id, l->p->id->core,
                l->name, (unsigned long long)h->seq, h->chunk, (unsigned long long)h->step);
        log_warn("collective's chunk lost", "reason=%s", log_q(e.msg));
        l->p->fail_seq(l->p, op->seq, &e, 1, -1);
        chan_arm(l);
        return DP_BUF_DISCARD;
    }
    if (!t->in_cut && h->seq == op->seq && (posted_later(l, h) || h->step > op->step)) {
        /* a chunk the link carries after the one expected: that one never
         * came. The peer and the connections are sound: the peer hears the
         * cause with every other core, and the link goes on with the next
         * collective (the rest of this one is thrown away as it comes). */
        err_set(&e, CODE_UNAVAILABLE,
                "chunk %u (step %u) of %s #%llu from core %s to core %s/%d was lost on the way: chunk %u (step "
                "%llu), which the link carries after it, came in its place",
                op->chunk, op->step, op->what, (unsigned long long)op->seq, l->name, l->p->id->host_id, l->p->id->core,
                h->chunk, (unsigned long long)h->step);
        log_warn("collective's chunk lost", "reason=%s", log_q(e.msg));
        l->p->fail_seq(l->p, op->seq, &e, 1, -1);
        chan_arm(l);
        return DP_BUF_DISCARD;
    }
    if (t->in_cut) /* written into the connection that was cut, never read: lost, not a disagreement */
        err_set(&e, CODE_UNAVAILABLE,
                "the data connection from core %s was cut and what it had sent on it was lost: it now sends "
                "chunk %u (step %llu) of #%llu where chunk %u (step %u) of %s #%llu was expected",
                l->name, h->chunk, (unsigned long long)h->step, (unsigned long long)h->seq, op->chunk, op->step,
                op->what, (unsigned long long)op->seq);
    else
        err_set(&e, CODE_INTERNAL,
                "core %s sent chunk %u (step %llu, offset %llu, %llu bytes) of #%llu where chunk %u (step %u, "
                "offset %llu, %zu bytes) of %s #%llu was expected: the cores disagree about the collective",
                l->name, h->chunk, (unsigned long long)h->step, (unsigned long long)h->offset,
                (unsigned long long)h->payload_bytes, (unsigned long long)h->seq, op->chunk, op->step,
                (unsigned long long)op->offset, op->len, op->what, (unsigned long long)op->seq);
    log_warn(t->in_cut ? "collective's chunks lost with a cut connection" : "collective protocol error", "reason=%s",
             log_q(e.msg));
    chan_fail(l, op->seq, &e);
    return DP_BUF_FAILED;
}

static void in_frame(dp_conn *c, const Tpuemu__FrameHeader *h, uint8_t *payload, size_t len)
{
    struct chan *l = dp_conn_data(c);
    err e;

    (void)len;
    free(payload);
    if (l->closing || tl(l)->in != c)
        return;
    if (h->kind == TPUEMU__FRAME_KIND__FRAME_ABORT) {
        const char *why = h->status && h->status->message ? h->status->message : "no reason given";
        int code = h->status && h->status->code ? (int)h->status->code : CODE_UNAVAILABLE;
        err_set(&e, code, "%s #%llu aborted by core %s: %s", chan_what_of(l->p, h->seq),
                (unsigned long long)h->seq, l->name, why);
        log_info("collective aborted by a peer", "peer=%s reason=%s", log_q(l->name), log_q(e.msg));
        chan_aborted(l, h->seq, &e);
        return;
    }
    /* a CHUNK read into the head receive's buffer (in_payload_buf matched it) */
    struct lop *op = lopq_pop(&l->rq);
    if (!op)
        return;
    if (op->red && op->len)
        op->red(op->red_arg, op->buf, tl(l)->rtmp, op->len);
    chan_progress(l);
    chan_trace_done(l, op);
    op->cb(op->arg, &ok_err);
    free(op);
    if (!l->closing)
        chan_arm(l);
}

static void in_close(dp_conn *c, const err *why)
{
    struct chan *l = dp_conn_data(c);
    struct tcp_link *t = tl(l);
    (void)why;
    if (t->in == c) {
        t->in = NULL;
        t->in_cut = 1;
        if (!l->closing && l->rq.head) {
            /* wait a little for an ABORT that names the root cause */
            unsigned linger = l->p->timeout_ms / 8 + 1;
            if (!l->linger_err)
                l->linger_err = malloc(sizeof *l->linger_err);
            if (l->linger_err)
                lost_err(l, l->rq.head, l->linger_err);
            l->linger_until = uv_now(l->p->loop) + linger;
            chan_arm(l);
        }
    }
    chan_unref(l);
}

void tcp_attach_in(struct chan *l, dp_conn *c)
{
    struct tcp_link *t = tl(l);
    struct dp_conn_cfg cfg;

    memset(&cfg, 0, sizeof cfg);
    cfg.on_frame = in_frame;
    cfg.on_close = in_close;
    cfg.payload_buf = in_payload_buf;
    cfg.data = l;
    cfg.max_payload = XPORT_MAX_CHUNK;
    dp_conn_set_handlers(c, &cfg);
    l->refs++;
    if (t->in) {
        dp_conn *old = t->in;
        t->in = NULL;
        t->in_cut = 1;
        dp_conn_close(old, NULL);
    }
    t->in = c;
    l->linger_until = 0;
}

/* ---- the ops ---- */

/* The outgoing half over TCP: dials when there is no connection (the first
 * send, or it went away between collectives; a peer that cannot be reached
 * fails the head send's collective), else issues what is queued once the
 * connection is ready. */
static void tcp_kick_tx(struct chan *l)
{
    err e, fe;
    if (tl(l)->out) {
        tcp_issue_sends(l);
        return;
    }
    if (tcp_dial(l, &e) != CODE_OK && l->sq.head) {
        const struct lop *op = l->sq.head;
        err_set(&fe, CODE_UNAVAILABLE, "cannot reach core %s for chunk %u of %s #%llu: %s", l->name, op->chunk,
                op->what, (unsigned long long)op->seq, e.msg);
        chan_fail(l, op->seq, &fe);
    }
}

/* A failed collective's writes did not drain: cut the connection, and
 * redial for the ABORTs still to go. */
static void tcp_unstick(struct chan *l)
{
    struct tcp_link *t = tl(l);
    dp_conn *c = t->out;
    if (!c)
        return;
    t->out = NULL;
    t->out_ready = 0;
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

static void tcp_recv_posted(struct chan *l)
{
    if (tl(l)->in)
        dp_conn_resume(tl(l)->in);
}

static uint64_t tcp_bytes_in(const struct chan *l)
{
    return tl(l)->in ? dp_conn_bytes_read(tl(l)->in) : 0;
}

static void tcp_discard(struct chan *l)
{
    if (tl(l)->in)
        dp_conn_discard_current(tl(l)->in);
}

/* A TCP half closes with the ctl, which owns the connections. */
static void tcp_half_close(struct chan *l)
{
    (void)l;
}

static int tcp_ctl_start(struct chan *l, err *e)
{
    if (!(l->ctl.st = calloc(1, sizeof(struct tcp_link))))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for a link");
    return CODE_OK;
}

/* Writes the queued ABORTs if the outgoing connection is ready, else dials
 * it (they go once it is; a peer that cannot be reached gets none). */
static void tcp_ctl_abort(struct chan *l)
{
    err de;
    if (tl(l)->out && tl(l)->out_ready)
        tcp_send_abort(l);
    else if (!tl(l)->out && tcp_dial(l, &de) != CODE_OK)
        l->naborts = 0;
}

/* Closes both connections; issued writes complete (cancelled) from the loop. */
static void tcp_ctl_close(struct chan *l)
{
    struct tcp_link *t = tl(l);
    dp_conn *c;
    if ((c = t->out) != NULL) {
        t->out = NULL;
        t->out_ready = 0;
        dp_conn_close(c, NULL);
    }
    if ((c = t->in) != NULL) {
        t->in = NULL;
        dp_conn_close(c, NULL);
    }
}

static void tcp_ctl_release(struct chan *l)
{
    struct tcp_link *t = tl(l);
    if (t)
        free(t->rtmp);
    free(t);
    l->ctl.st = NULL;
}

const struct chan_ops chan_tcp_tx = {
    .name = "tcp",
    .kick = tcp_kick_tx,
    .unstick = tcp_unstick,
    .close = tcp_half_close,
};
const struct chan_ops chan_tcp_rx = {
    .name = "tcp",
    .kick = tcp_recv_posted,
    .bytes_in = tcp_bytes_in,
    .discard = tcp_discard,
    .close = tcp_half_close,
};
const struct chan_ops chan_tcp_ctl = {
    .name = "tcp",
    .start = tcp_ctl_start,
    .abort = tcp_ctl_abort,
    .close = tcp_ctl_close,
    .release = tcp_ctl_release,
};
