/* The client's data-plane connections and their poll() loop (dpio.h). Knows
 * frames and sockets, not what the frames mean: that is the owner's ops. */
#include "dpio.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dpauth.h"
#include "wire.h"

/* A queued frame: its prefix + header, then its payload's segments. */
struct dpio_out {
    struct dpio_out *next;
    size_t hlen, hput;
    size_t nseg, si, soff;
    uint8_t *hdr;           /* hlen bytes, after segs[] in the same block */
    struct dpio_seg segs[]; /* nseg */
};

enum { RD_PREFIX = 0, RD_HEADER, RD_PAYLOAD };

/* ---- connecting ---- */

static int wait_one(int fd, short ev, uint64_t deadline_ms)
{
    for (;;) {
        uint64_t now = wire_now_ms();
        struct pollfd pf = {fd, ev, 0};
        if (now >= deadline_ms)
            return 0;
        int rc = poll(&pf, 1, (int)(deadline_ms - now));
        if (rc > 0)
            return 1;
        if (rc < 0 && errno != EINTR)
            return -1;
    }
}

/* TCP connect within the deadline; the socket stays non-blocking. */
static int tcp_connect(const struct dpio_conn *p, uint64_t deadline_ms, int *out, err *e)
{
    struct addrinfo hints, *res = NULL;
    addr a;
    char port[16];
    int fd = -1, rc, soerr = 0, one = 1;
    socklen_t sl = sizeof soerr;

    if (addr_parse(p->addr, 0, &a, e) != CODE_OK || a.port <= 0)
        return err_set(e, CODE_INTERNAL, "core %s/%d has no usable data address ('%s')", p->host, p->core,
                       p->addr);
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(port, sizeof port, "%d", a.port);
    if ((rc = getaddrinfo(a.host, port, &hints, &res)) != 0)
        return err_set(e, CODE_UNAVAILABLE, "core %s/%d: cannot resolve its data address %s: %s", p->host,
                       p->core, p->addr, gai_strerror(rc));
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return err_set(e, CODE_UNAVAILABLE, "socket: %s", strerror(errno));
    }
    rc = connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (rc < 0 && errno != EINPROGRESS)
        goto fail;
    if (rc < 0) {
        int w = wait_one(fd, POLLOUT, deadline_ms);
        if (w == 0) {
            close(fd);
            return err_set(e, CODE_UNAVAILABLE, "core %s/%d did not accept a data connection at %s in time",
                           p->host, p->core, p->addr);
        }
        if (w < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
            goto fail;
        if (soerr) {
            errno = soerr;
            goto fail;
        }
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    *out = fd;
    return CODE_OK;
fail:
    rc = errno;
    close(fd);
    return err_set(e, CODE_UNAVAILABLE, "cannot open a data connection to core %s/%d at %s: %s", p->host,
                   p->core, p->addr, strerror(rc));
}

int dpio_dial(struct dpio_conn *c, const auth *a, const char *sender, uint64_t deadline_ms, err *e)
{
    uint64_t now = wire_now_ms(), dl;
    int fd = -1, rc;
    dl = now + DPIO_CONNECT_MS < deadline_ms ? now + DPIO_CONNECT_MS : deadline_ms;
    if ((rc = tcp_connect(c, dl, &fd, e)) != CODE_OK)
        return rc;
    now = wire_now_ms();
    if ((rc = dpauth_client_fd(fd, a, sender, dl > now ? (int)(dl - now) : 0, e)) != CODE_OK) {
        close(fd);
        if (rc == CODE_DEADLINE_EXCEEDED)
            rc = CODE_UNAVAILABLE;
        e->code = rc;
        err_prefix(e, "core %s/%d at %s", c->host, c->core, c->addr);
        return rc;
    }
    c->fd = fd;
    c->err_code = CODE_OK;
    c->err[0] = '\0';
    return CODE_OK;
}

int dpio_connect(struct dpio_conn *c, size_t n, const auth *a, const char *sender, uint64_t deadline_ms,
                 err *e)
{
    for (size_t i = 0; i < n; i++) {
        int rc;
        if (c[i].fd >= 0)
            continue;
        if ((rc = dpio_dial(&c[i], a, sender, deadline_ms, e)) != CODE_OK)
            return rc;
    }
    return CODE_OK;
}

static void drop_queue(struct dpio_conn *c)
{
    while (c->oq) {
        struct dpio_out *o = c->oq;
        c->oq = o->next;
        free(o);
    }
    c->oq_tail = NULL;
}

void dpio_close(struct dpio_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    drop_queue(c);
    free(c->hdr);
    c->hdr = NULL;
    c->wfailed = 0;
    c->reading = 0;
    c->rd = RD_PREFIX;
    c->got = 0;
    c->dst = NULL;
    c->left = 0;
}

int dpio_failf(struct dpio_conn *c, int code, const char *fmt, ...)
{
    va_list ap;
    int k = snprintf(c->err, sizeof c->err, "core %s/%d ", c->host, c->core);
    if (k < 0 || (size_t)k >= sizeof c->err)
        k = 0;
    va_start(ap, fmt);
    vsnprintf(c->err + k, sizeof c->err - (size_t)k, fmt, ap);
    va_end(ap);
    c->err_code = code;
    return code;
}

/* ---- writing ---- */

int dpio_send(struct dpio_conn *c, Tpuemu__FrameHeader *h, const struct dpio_seg *segs, size_t nseg)
{
    uint8_t hdr[DPAUTH_FRAME_MAX];
    uint64_t total = 0;
    size_t hlen;
    struct dpio_out *o;

    for (size_t i = 0; i < nseg; i++)
        total += segs[i].n;
    h->payload_bytes = total;
    if (!(hlen = frame_encode(h, hdr, sizeof hdr)))
        return CODE_INVALID_ARGUMENT;
    if (!(o = malloc(sizeof *o + nseg * sizeof *segs + hlen)))
        return CODE_RESOURCE_EXHAUSTED;
    memset(o, 0, sizeof *o);
    if (nseg)
        memcpy(o->segs, segs, nseg * sizeof *segs);
    o->nseg = nseg;
    o->hdr = (uint8_t *)&o->segs[nseg];
    memcpy(o->hdr, hdr, hlen);
    o->hlen = hlen;
    if (c->oq_tail)
        c->oq_tail->next = o;
    else
        c->oq = o;
    c->oq_tail = o;
    c->wfailed = 0;
    return CODE_OK;
}

int dpio_sent_all(const struct dpio_conn *c)
{
    return !c->oq && !c->wfailed;
}

/* Writes what the socket takes; -1 when the connection refuses more. */
static int pump_out(struct dpio_conn *c)
{
    while (c->oq) {
        struct dpio_out *o = c->oq;
        const uint8_t *buf;
        size_t len;
        if (o->hput < o->hlen) {
            buf = o->hdr + o->hput;
            len = o->hlen - o->hput;
        } else if (o->si < o->nseg) {
            buf = (const uint8_t *)o->segs[o->si].p + o->soff;
            len = o->segs[o->si].n - o->soff;
        } else {
            c->oq = o->next;
            if (!c->oq)
                c->oq_tail = NULL;
            free(o);
            continue;
        }
        ssize_t n = len ? send(c->fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) : 0;
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

/* ---- reading ---- */

static const char *label_sep(const struct dpio_run *run, const char *sep)
{
    return run->label ? sep : "";
}

/* A whole header is in: decode it and ask the owner where its payload goes.
 * 0: read on; -1: the connection is done for (its error is set). */
static int header_in(struct dpio_conn *c, size_t i, struct dpio_run *run)
{
    Tpuemu__FrameHeader *h = NULL;
    void *dst = NULL;
    err e;
    int rc;

    if (frame_decode(c->hdr, c->hlen, c->max_payload ? c->max_payload : FRAME_MAX_PAYLOAD, &h, &e) != CODE_OK) {
        dpio_failf(c, CODE_INTERNAL, "sent a malformed answer%s%s: %.900s", label_sep(run, " to "),
                   label_sep(run, run->label), e.msg);
        return -1;
    }
    c->err_code = CODE_OK;
    rc = run->ops->on_header(run->arg, i, h, &dst);
    c->left = rc == DPIO_PAYLOAD ? h->payload_bytes : 0;
    frame_header_free(h);
    if (rc == DPIO_LOST) {
        if (c->err_code == CODE_OK)
            dpio_failf(c, CODE_INTERNAL, "sent a frame that was not expected");
        return -1;
    }
    c->dst = dst;
    c->rd = RD_PAYLOAD;
    c->got = 0;
    return 0;
}

/* Reads what the socket has: 0 for "nothing more now" (or the owner stopped
 * reading), -1 when the connection is done for (its error is set). */
static int pump_in(struct dpio_conn *c, size_t i, struct dpio_run *run)
{
    uint8_t scratch[16 * 1024];
    while (c->reading) {
        uint8_t *buf;
        size_t want;
        err e;
        if (c->rd == RD_PREFIX) {
            buf = c->pre + c->got;
            want = sizeof c->pre - c->got;
        } else if (c->rd == RD_HEADER) {
            buf = c->hdr + c->got;
            want = c->hlen - c->got;
        } else if (c->dst) {
            buf = c->dst + c->got;
            want = (size_t)c->left;
        } else {
            buf = scratch;
            want = c->left < sizeof scratch ? (size_t)c->left : sizeof scratch;
        }
        ssize_t n = want ? recv(c->fd, buf, want, MSG_DONTWAIT) : 0;
        if (want && n == 0) {
            dpio_failf(c, CODE_UNAVAILABLE, "closed its data connection%s%s (the process died or was cut off)",
                       label_sep(run, " during "), label_sep(run, run->label));
            return -1;
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return 0;
            dpio_failf(c, CODE_UNAVAILABLE, "%s its data connection%s%s (the process died or was cut off)",
                       errno == ECONNRESET ? "reset" : "lost", label_sep(run, " during "),
                       label_sep(run, run->label));
            return -1;
        }
        c->got += (size_t)n;
        if (c->rd == RD_PREFIX && c->got == sizeof c->pre) {
            if (frame_prefix(c->pre, &c->hlen, &e) != CODE_OK) {
                dpio_failf(c, CODE_INTERNAL, "sent a bad frame: %.900s", e.msg);
                return -1;
            }
            if (!c->hdr && !(c->hdr = malloc(FRAME_MAX_HEADER))) {
                dpio_failf(c, CODE_RESOURCE_EXHAUSTED, "could not be read: out of memory");
                return -1;
            }
            c->rd = RD_HEADER;
            c->got = 0;
        } else if (c->rd == RD_HEADER && c->got == c->hlen) {
            if (header_in(c, i, run) < 0)
                return -1;
        } else if (c->rd == RD_PAYLOAD) {
            c->left -= (size_t)n;
            if (!c->dst)
                c->got = 0;
        }
        if (c->rd == RD_PAYLOAD && c->left == 0) {
            uint64_t got = c->dst ? c->got : 0;
            c->rd = RD_PREFIX;
            c->got = 0;
            c->dst = NULL;
            if (run->ops->on_frame(run->arg, i, got)) {
                c->reading = 0; /* done with in this run: no more writing either */
                if (c->oq) {
                    drop_queue(c);
                    c->wfailed = 1;
                }
            }
        }
    }
    return 0;
}

static void lost(struct dpio_conn *c, size_t i, struct dpio_run *run)
{
    run->ops->on_lost(run->arg, i, c->err_code, c->err);
    dpio_close(c);
}

/* ---- the loop ---- */

/* One epoll set for the call: a wake-up costs the connections that are
 * ready, not all n (with poll() every wake-up handed the kernel all n
 * descriptors, and a step's n answers arriving apart made that n x n a step:
 * the client's CPU per step grew with the square of the cores). A
 * connection's events are changed only when what it waits for changes. */
enum dpio_end dpio_run(struct dpio_conn *c, size_t n, struct dpio_run *run)
{
    enum {
        MAXEV = 64
    };
    struct epoll_event ev[MAXEV];
    uint32_t *mask = calloc(n ? n : 1, sizeof *mask); /* events registered for c[i].fd; 0: none */
    int *rfd = malloc((n ? n : 1) * sizeof *rfd);     /* the descriptor registered for c[i] */
    int ep = epoll_create1(EPOLL_CLOEXEC);
    uint64_t end = run->deadline_ms, grace = run->grace_ms;
    enum dpio_end why = DPIO_END_DEADLINE;

    run->grace_used = 0;
    if (!mask || !rfd || ep < 0) {
        free(mask);
        free(rfd);
        if (ep >= 0)
            close(ep);
        return DPIO_END_NOMEM;
    }
    for (size_t i = 0; i < n; i++)
        rfd[i] = -1;
    {
        struct epoll_event e = {.events = EPOLLIN, .data.u64 = n}; /* tpu_cancel's eventfd */
        int cfd = cli_cancel_fd(run->cancel);
        if (cfd >= 0)
            epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &e);
    }
    for (;;) {
        uint64_t now = wire_now_ms();
        size_t np = 0;
        int st = run->ops->state(run->arg);
        if (st == DPIO_DONE) {
            why = DPIO_END_DONE;
            break;
        }
        if (cli_cancel_requested(run->cancel)) {
            why = DPIO_END_CANCELLED;
            break;
        }
        if (st == DPIO_FAILING && grace && now + grace < end)
            end = now + grace, run->grace_used = grace, grace = 0; /* once */
        if (now >= end)
            break;
        for (size_t i = 0; i < n; i++) {
            uint32_t want = 0;
            if (c[i].fd >= 0 && (c[i].reading || c[i].oq))
                want = (c[i].reading ? (uint32_t)EPOLLIN : 0u) | (c[i].oq ? (uint32_t)EPOLLOUT : 0u);
            if (rfd[i] >= 0 && rfd[i] != c[i].fd) /* closed (and gone from the set) or replaced */
                rfd[i] = -1, mask[i] = 0;
            if (want != mask[i]) {
                struct epoll_event e = {.events = want, .data.u64 = i};
                if (!want)
                    epoll_ctl(ep, EPOLL_CTL_DEL, c[i].fd, &e);
                else if (epoll_ctl(ep, rfd[i] >= 0 ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c[i].fd, &e) != 0 &&
                         errno == EEXIST) /* a new descriptor with a closed one's number */
                    epoll_ctl(ep, EPOLL_CTL_MOD, c[i].fd, &e);
                mask[i] = want;
                rfd[i] = want ? c[i].fd : -1;
            }
            np += want != 0;
        }
        if (!np) {
            why = DPIO_END_IDLE;
            break;
        }
        int rc = epoll_wait(ep, ev, MAXEV, (int)(end - now));
        if (rc < 0 && errno != EINTR)
            break;
        for (int j = 0; j < rc; j++) {
            size_t i = (size_t)ev[j].data.u64;
            if (i >= n)
                continue; /* tpu_cancel: seen at the top */
            struct dpio_conn *k = &c[i];
            uint32_t re = ev[j].events;
            if (k->fd < 0 || k->fd != rfd[i])
                continue;
            if ((re & EPOLLOUT) && pump_out(k) < 0) {
                drop_queue(k); /* keep reading: the core's ERROR frame says why it stopped reading */
                k->wfailed = 1;
            }
            if ((re & (EPOLLIN | EPOLLHUP | EPOLLERR)) && k->reading && pump_in(k, i, run) < 0)
                lost(k, i, run);
        }
    }
    close(ep);
    free(mask);
    free(rfd);
    return why;
}
