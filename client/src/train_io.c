/* Training requests on the data connections (train_io.h): per replica, a queue
 * of frames to write and a FIFO of answers expected, and one poll() loop over
 * every connection that writes and reads at the same time, so a core's answer
 * is read while the next requests' infeed is still going out. */
#include "train_io.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "dpauth.h"
#include "frame.h"
#include "frame_rd.h"

#define KIND(k) TPUEMU__FRAME_KIND__FRAME_##k
#define TIO_MAX_PEND 64

struct tio_out {
    struct tio_out *next;
    uint8_t hdr[DPAUTH_FRAME_MAX];
    size_t hlen, hput;
    struct tio_seg segs[TIO_MAX_SEGS];
    size_t nseg, si, soff;
};

struct tio_stream {
    struct tio_out *oq, *oq_tail;
    struct tio_ans *pend[TIO_MAX_PEND];
    uint64_t pend_seq[TIO_MAX_PEND];
    size_t ph, pn; /* FIFO head and count */
    struct frame_rd rd;
    struct tio_ans *cur; /* whose payload is being read */
    unsigned failures;   /* answers that said a request failed, of any step in flight */
};

static struct tio_stream *streams(tpu_cluster *c)
{
    struct cli_coll *k = c->coll;
    if (!k->tio)
        k->tio = calloc(k->n, sizeof *k->tio);
    return k->tio;
}

static void ans_fail(struct tio_ans *a, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void ans_fail(struct tio_ans *a, int code, const char *fmt, ...)
{
    va_list ap;
    if (a->done)
        return;
    a->done = 1;
    a->code = code;
    va_start(ap, fmt);
    vsnprintf(a->msg, sizeof a->msg, fmt, ap);
    va_end(ap);
}

static void stream_clear(struct tio_stream *s)
{
    while (s->oq) {
        struct tio_out *o = s->oq;
        s->oq = o->next;
        free(o);
    }
    s->oq_tail = NULL;
    s->ph = s->pn = 0;
    memset(&s->rd, 0, sizeof s->rd);
    s->cur = NULL;
    s->failures = 0;
}

/* The connection of replica r is done for: every answer still expected fails. */
static void stream_lost(tpu_cluster *c, size_t r, int code, const char *why)
{
    struct cli_coll *k = c->coll;
    struct tio_stream *s = &k->tio[r];
    struct cli_peer *p = &k->peers[r];
    for (size_t i = 0; i < s->pn; i++)
        ans_fail(s->pend[(s->ph + i) % TIO_MAX_PEND], code, "core %s/%d %s", p->host, p->core, why);
    stream_clear(s);
    coll_io_close(p);
}

int tio_post(tpu_cluster *c, size_t r, Tpuemu__FrameHeader *h, const struct tio_seg *segs, size_t nseg,
             struct tio_ans *ans, err *e)
{
    struct cli_coll *k = c->coll;
    struct tio_stream *s = streams(c);
    struct tio_out *o;
    uint64_t total = 0;

    if (!s)
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    s += r;
    memset(ans, 0, offsetof(struct tio_ans, dst));
    ans->nstats = 0;
    ans->got = 0;
    if (nseg > TIO_MAX_SEGS || s->pn >= TIO_MAX_PEND)
        return err_set(e, CODE_INTERNAL, "too many requests in flight to core %s/%d", k->peers[r].host,
                       k->peers[r].core);
    if (k->peers[r].fd < 0) {
        if (s->pn) /* answers still expected on a connection that is gone */
            return err_set(e, CODE_UNAVAILABLE, "core %s/%d lost its data connection", k->peers[r].host,
                           k->peers[r].core);
        if (coll_io_connect(c, wire_now_ms() + COLL_CONNECT_MS, e) != CODE_OK)
            return e->code;
    }
    if (!(o = calloc(1, sizeof *o)))
        return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; i < nseg; i++)
        total += segs[i].n;
    h->epoch = k->epoch;
    h->payload_bytes = total;
    if (!(o->hlen = frame_encode(h, o->hdr, sizeof o->hdr))) {
        free(o);
        return err_set(e, CODE_INVALID_ARGUMENT, "the request does not fit in a frame header");
    }
    if (nseg)
        memcpy(o->segs, segs, nseg * sizeof *segs);
    o->nseg = nseg;
    if (s->oq_tail)
        s->oq_tail->next = o;
    else
        s->oq = o;
    s->oq_tail = o;
    s->pend[(s->ph + s->pn) % TIO_MAX_PEND] = ans;
    s->pend_seq[(s->ph + s->pn) % TIO_MAX_PEND] = h->seq;
    s->pn++;
    return CODE_OK;
}

static int do_write(struct tio_stream *s, int fd)
{
    while (s->oq) {
        struct tio_out *o = s->oq;
        const uint8_t *buf;
        size_t len;
        if (o->hput < o->hlen) {
            buf = o->hdr + o->hput;
            len = o->hlen - o->hput;
        } else if (o->si < o->nseg) {
            buf = (const uint8_t *)o->segs[o->si].p + o->soff;
            len = o->segs[o->si].n - o->soff;
        } else {
            s->oq = o->next;
            if (!s->oq)
                s->oq_tail = NULL;
            free(o);
            continue;
        }
        ssize_t n = len ? send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) : 0;
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return 0;
            return -1;
        }
        if (o->hput < o->hlen) {
            o->hput += (size_t)n;
        } else {
            o->soff += (size_t)n;
            if (o->soff == o->segs[o->si].n)
                o->si++, o->soff = 0;
        }
    }
    return 0;
}

/* A whole answer header is in: match it to the oldest expected answer. */
struct rd_ctx {
    struct tio_stream *s;
    const struct cli_peer *p;
    char *why;
    size_t whyn;
};

static int on_header(void *arg, const uint8_t *hdr, uint32_t hlen, uint8_t **dst, uint64_t *left)
{
    struct rd_ctx *k = arg;
    struct tio_stream *s = k->s;
    const struct cli_peer *p = k->p;
    char *why = k->why;
    size_t whyn = k->whyn;
    Tpuemu__FrameHeader *h = NULL;
    err e;
    struct tio_ans *a = s->pn ? s->pend[s->ph] : NULL;

    if (frame_decode(hdr, hlen, FRAME_MAX_PAYLOAD, &h, &e) != CODE_OK) {
        snprintf(why, whyn, "sent a malformed answer: %.900s", e.msg);
        return -1;
    }
    *left = h->payload_bytes;
    s->cur = NULL;
    if (h->kind == KIND(ERROR)) {
        s->failures++;
        snprintf(why, whyn, "refused the request: %.900s",
                 h->status && h->status->message ? h->status->message : "(no reason given)");
        if (a) {
            ans_fail(a, h->status && h->status->code ? (int)h->status->code : CODE_UNKNOWN, "%s",
                     h->status && h->status->message && *h->status->message ? h->status->message
                                                                             : "the core refused the request");
        }
        frame_header_free(h); /* the core closes the connection after an ERROR */
        return -1;
    }
    if (h->kind != KIND(MODEL_RESULT) || !a || h->seq != s->pend_seq[s->ph]) {
        snprintf(why, whyn, "answered with frame kind %d, seq %llu, which was not expected", (int)h->kind,
                 (unsigned long long)h->seq);
        frame_header_free(h);
        return -1;
    }
    if (h->status && h->status->code != TPUEMU__CODE__OK) {
        s->failures++;
        a->code = (int)h->status->code;
        snprintf(a->msg, sizeof a->msg, "%s", h->status->message && *h->status->message ? h->status->message
                                                                                      : "the request failed");
    } else {
        a->code = CODE_OK;
        a->msg[0] = '\0';
        if (h->payload_bytes > (a->dst ? a->dst_cap : 0)) {
            a->code = CODE_INTERNAL;
            snprintf(a->msg, sizeof a->msg, "core %s/%d answered with %llu payload bytes, at most %zu expected",
                     p->host, p->core, (unsigned long long)h->payload_bytes, a->dst ? a->dst_cap : 0);
        } else {
            *dst = a->dst;
        }
        a->nstats = h->n_step_stats < TIO_MAX_STEPS ? h->n_step_stats : TIO_MAX_STEPS;
        for (size_t i = 0; i < a->nstats; i++) {
            const Tpuemu__StepStat *st = h->step_stats[i];
            struct tio_stat *d = &a->stats[i];
            d->loss_sum = st->loss_sum;
            d->correct = st->correct;
            d->rows = st->rows;
            d->compute_ns = st->compute_ns;
            d->matmul_ns = st->matmul_ns;
            d->allreduce_ns = st->allreduce_ns;
            d->optimizer_ns = st->optimizer_ns;
            d->infeed_wait_ns = st->infeed_wait_ns;
        }
        if (h->state) {
            a->num_params = h->state->num_params;
            a->num_slots = h->state->num_slots;
            a->iterations = h->state->iterations;
        }
    }
    a->hbm_used = h->hbm_used;
    a->hbm_capacity = h->hbm_capacity;
    s->cur = a;
    s->ph = (s->ph + 1) % TIO_MAX_PEND;
    s->pn--;
    frame_header_free(h);
    return 0;
}

static void on_payload(void *arg, uint64_t got)
{
    struct tio_stream *s = ((struct rd_ctx *)arg)->s;
    if (s->cur) {
        s->cur->got = (size_t)got;
        s->cur->done = 1;
        s->cur = NULL;
    }
}

static int do_read(struct tio_stream *s, int fd, const struct cli_peer *p, char *why, size_t whyn)
{
    static const struct frame_rd_ops ops = {on_header, on_payload};
    struct rd_ctx k = {s, p, why, whyn};
    char how[ERR_MSG_MAX];
    switch (frame_rd_pump(&s->rd, fd, 0, &ops, &k, how, sizeof how)) {
    case FRD_AGAIN:
        return 0;
    case FRD_CLOSED:
    case FRD_BROKEN:
        snprintf(why, whyn, "%.16s its data connection (the process died or was cut off)", how);
        return -1;
    case FRD_BAD:
        snprintf(why, whyn, "sent a bad frame: %.900s", how);
        return -1;
    default: /* on_header said why */
        return -1;
    }
}

size_t tio_wait(tpu_cluster *c, struct tio_ans *const *ans, uint64_t deadline_ms, uint64_t grace_ms)
{
    struct cli_coll *k = c->coll;
    struct tio_stream *ss = streams(c);
    size_t n = k->n, failed = 0;
    struct pollfd *pf = calloc(n, sizeof *pf);
    uint64_t end = deadline_ms, grace_used = 0;
    char why[ERR_MSG_MAX];

    if (!pf || !ss) {
        free(pf);
        for (size_t r = 0; r < n; r++)
            ans_fail(ans[r], CODE_RESOURCE_EXHAUSTED, "out of memory");
        return n;
    }
    for (;;) {
        uint64_t now = wire_now_ms();
        size_t open_n = 0, np = 0;
        int any_failed = 0;
        for (size_t r = 0; r < n; r++) {
            if (!ans[r]->done)
                open_n++;
            else if (ans[r]->code != CODE_OK)
                any_failed = 1;
        }
        if (!open_n)
            break;
        /* a core that failed a later step in flight (pipelined steps) failed
         * too: the cores that cannot answer this one get the grace, not the
         * whole deadline */
        for (size_t r = 0; r < n && !any_failed; r++)
            any_failed = ss[r].failures > 0;
        if (any_failed && grace_ms && now + grace_ms < end)
            end = now + grace_ms, grace_used = grace_ms, grace_ms = 0;
        if (now >= end)
            break;
        for (size_t r = 0; r < n; r++) {
            pf[r].fd = k->peers[r].fd;
            pf[r].events = 0;
            pf[r].revents = 0;
            if (pf[r].fd < 0)
                continue;
            pf[r].events = POLLIN | (ss[r].oq ? POLLOUT : 0);
            np++;
        }
        if (!np) {
            for (size_t r = 0; r < n; r++)
                if (!ans[r]->done)
                    ans_fail(ans[r], CODE_UNAVAILABLE, "core %s/%d has no data connection", k->peers[r].host,
                             k->peers[r].core);
            break;
        }
        int rc = poll(pf, n, (int)(end - now));
        if (rc < 0 && errno != EINTR)
            break;
        for (size_t r = 0; r < n && rc > 0; r++) {
            struct tio_stream *s = &ss[r];
            struct cli_peer *p = &k->peers[r];
            if (pf[r].fd < 0 || !pf[r].revents)
                continue;
            if ((pf[r].revents & POLLOUT) && do_write(s, p->fd) < 0) {
                /* keep reading: the core's ERROR frame says why it stopped reading */
                while (s->oq) {
                    struct tio_out *o = s->oq;
                    s->oq = o->next;
                    free(o);
                }
                s->oq_tail = NULL;
            }
            if ((pf[r].revents & (POLLIN | POLLHUP | POLLERR)) && do_read(s, p->fd, p, why, sizeof why) < 0)
                stream_lost(c, r, CODE_UNAVAILABLE, why);
        }
    }
    for (size_t r = 0; r < n; r++) {
        struct cli_peer *p = &k->peers[r];
        if (!ans[r]->done) {
            if (grace_used)
                ans_fail(ans[r], CODE_UNAVAILABLE,
                         "core %s/%d did not answer within %llu ms after another core failed (it hangs or is cut off)",
                         p->host, p->core, (unsigned long long)grace_used);
            else
                ans_fail(ans[r], CODE_DEADLINE_EXCEEDED, "core %s/%d did not answer in time", p->host, p->core);
        }
        if (ans[r]->code != CODE_OK)
            failed++;
    }
    free(pf);
    return failed;
}

const struct tio_ans *tio_worst(struct tio_ans *const *ans, size_t n)
{
    const struct tio_ans *best = NULL;
    int best_rank = -1;
    for (size_t r = 0; r < n; r++) {
        const struct tio_ans *a = ans[r];
        int rank;
        if (!a->done || a->code == CODE_OK)
            continue;
        /* a core that names the core that failed its all-reduce tells most */
        if (strstr(a->msg, "never sent") || strstr(a->msg, "did not answer") || strstr(a->msg, "stopped"))
            rank = 3;
        else if (a->code != CODE_ABORTED && a->code != CODE_DEADLINE_EXCEEDED)
            rank = 2;
        else
            rank = 1;
        if (rank > best_rank)
            best = a, best_rank = rank;
    }
    return best;
}

void tio_abort(tpu_cluster *c)
{
    struct cli_coll *k = c->coll;
    if (!k || !k->tio)
        return;
    for (size_t r = 0; r < k->n; r++) {
        for (size_t i = 0; i < k->tio[r].pn; i++)
            ans_fail(k->tio[r].pend[(k->tio[r].ph + i) % TIO_MAX_PEND], CODE_ABORTED, "abandoned");
        stream_clear(&k->tio[r]);
        coll_io_close(&k->peers[r]);
    }
}

void tio_free(tpu_cluster *c)
{
    struct cli_coll *k = c->coll;
    if (!k || !k->tio)
        return;
    for (size_t r = 0; r < k->n; r++)
        stream_clear(&k->tio[r]);
    free(k->tio);
    k->tio = NULL;
}
