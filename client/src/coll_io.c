/* The client side of a collective on the wire: one authenticated data-plane
 * connection per core, and one poll() loop that writes every replica's input
 * and reads every core's result at the same time. Nothing here blocks on one
 * socket while another has work: a core answering (or failing) while inputs
 * are still being written never deadlocks the call. */
#include "coll.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dpauth.h"
#include "frame.h"
#include "frame_rd.h"

#define KIND(k) TPUEMU__FRAME_KIND__FRAME_##k

void coll_io_close(struct cli_peer *p)
{
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
}

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
static int tcp_connect(const struct cli_peer *p, uint64_t deadline_ms, int *out, err *e)
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

int coll_io_dial(tpu_cluster *c, struct cli_peer *p, uint64_t deadline_ms, err *e)
{
    uint64_t now = wire_now_ms(), dl;
    int fd = -1, rc;
    dl = now + COLL_CONNECT_MS < deadline_ms ? now + COLL_CONNECT_MS : deadline_ms;
    if ((rc = tcp_connect(p, dl, &fd, e)) != CODE_OK)
        return rc;
    now = wire_now_ms();
    if ((rc = dpauth_client_fd(fd, &c->r->auth, c->r->sender, dl > now ? (int)(dl - now) : 0, e)) != CODE_OK) {
        close(fd);
        if (rc == CODE_DEADLINE_EXCEEDED)
            rc = CODE_UNAVAILABLE;
        return err_set(e, rc, "data connection to core %s/%d at %s: %s", p->host, p->core, p->addr, e->msg);
    }
    p->fd = fd;
    return CODE_OK;
}

int coll_io_connect(tpu_cluster *c, uint64_t deadline_ms, err *e)
{
    struct cli_coll *k = c->coll;
    for (size_t r = 0; r < k->n; r++) {
        int rc;
        if (k->peers[r].fd >= 0)
            continue;
        if ((rc = coll_io_dial(c, &k->peers[r], deadline_ms, e)) != CODE_OK)
            return rc;
    }
    return CODE_OK;
}

/* ---- the exchange ---- */

struct xfer {
    uint8_t hdr[DPAUTH_FRAME_MAX];
    size_t hlen, hput;
    const uint8_t *in;
    size_t in_len, in_put;
    int wdone, wfailed;

    struct frame_rd rd;
    int clean;         /* ended with a whole result frame and the whole input written */
    int errframe;      /* the core sent ERROR: it closes the connection */
};

static void set_res(struct cli_res *res, int code, int from_core, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void set_res(struct cli_res *res, int code, int from_core, const char *fmt, ...)
{
    va_list ap;
    if (res->mono_ms)
        return; /* the first word stands */
    res->code = code;
    res->from_core = from_core;
    res->mono_ms = wire_now_ms();
    va_start(ap, fmt);
    vsnprintf(res->msg, sizeof res->msg, fmt, ap);
    va_end(ap);
}

static void closed_msg(const struct cli_peer *p, const char *what, uint64_t seq, struct cli_res *res,
                       const char *how)
{
    set_res(res, CODE_UNAVAILABLE, 0,
            "core %s/%d %s its data connection during %s #%llu (the process died or was cut off)", p->host,
            p->core, how, what, (unsigned long long)seq);
}

/* A whole result header arrived: check it and set up the payload read. */
struct rd_ctx {
    struct xfer *x;
    const struct cli_peer *p;
    const struct cli_part *part;
    uint64_t seq;
    const char *what;
    struct cli_res *res;
};

static int on_header(void *arg, const uint8_t *hdr, uint32_t hlen, uint8_t **dst, uint64_t *left)
{
    struct rd_ctx *k = arg;
    struct xfer *x = k->x;
    const struct cli_peer *p = k->p;
    const struct cli_part *part = k->part;
    uint64_t seq = k->seq;
    const char *what = k->what;
    struct cli_res *res = k->res;
    Tpuemu__FrameHeader *h = NULL;
    err e;
    if (frame_decode(hdr, hlen, (uint64_t)part->out_len > FRAME_MAX_PAYLOAD ? part->out_len
                                                                                    : FRAME_MAX_PAYLOAD,
                     &h, &e) != CODE_OK) {
        set_res(res, CODE_INTERNAL, 0, "core %s/%d sent a malformed answer to %s #%llu: %s", p->host, p->core,
                what, (unsigned long long)seq, e.msg);
        return -1;
    }
    *left = h->payload_bytes;
    if (h->kind == KIND(ERROR)) {
        set_res(res, h->status && h->status->code ? (int)h->status->code : CODE_UNKNOWN, 1, "%s",
                h->status && h->status->message && *h->status->message ? h->status->message
                                                                        : "the core refused the collective");
    } else if (h->kind != KIND(COLL_RESULT)) {
        set_res(res, CODE_INTERNAL, 0, "core %s/%d answered %s #%llu with frame kind %d", p->host, p->core,
                what, (unsigned long long)seq, (int)h->kind);
    } else if (h->seq != seq) {
        set_res(res, CODE_INTERNAL, 0, "core %s/%d answered collective #%llu while #%llu was expected",
                p->host, p->core, (unsigned long long)h->seq, (unsigned long long)seq);
    } else if (h->status && h->status->code != TPUEMU__CODE__OK) {
        set_res(res, (int)h->status->code, 1, "%s",
                h->status->message && *h->status->message ? h->status->message : "the collective failed");
    } else if (h->payload_bytes != part->out_len) {
        set_res(res, CODE_INTERNAL, 0, "core %s/%d returned %llu bytes for %s #%llu, expected %zu", p->host,
                p->core, (unsigned long long)h->payload_bytes, what, (unsigned long long)seq, part->out_len);
    } else if (!x->wdone && part->out_len) {
        set_res(res, CODE_INTERNAL, 0, "core %s/%d answered %s #%llu before it had read all of its input",
                p->host, p->core, what, (unsigned long long)seq);
    } else {
        *dst = part->out;
        res->ns = h->elapsed_ns;
        snprintf(res->algo, sizeof res->algo, "%s", h->algo_used ? h->algo_used : "");
    }
    /* the OK result is recorded only once its payload is in */
    int bad = res->mono_ms && !res->from_core && h->kind != KIND(ERROR);
    if (h->kind == KIND(ERROR)) {
        *left = 0; /* an ERROR closes the connection */
        x->errframe = 1;
    }
    frame_header_free(h);
    return bad ? -1 : 0;
}

static void on_payload(void *arg, uint64_t got)
{
    struct cli_res *res = ((struct rd_ctx *)arg)->res;
    (void)got;
    if (!res->mono_ms) {
        res->code = CODE_OK;
        res->msg[0] = '\0';
        res->from_core = 1;
        res->mono_ms = wire_now_ms();
    }
}

/* Reads what is there; returns -1 when the connection is done for. */
static int do_read(struct xfer *x, int fd, const struct cli_peer *p, const struct cli_part *part,
                   uint64_t seq, const char *what, struct cli_res *res)
{
    static const struct frame_rd_ops ops = {on_header, on_payload};
    struct rd_ctx k = {x, p, part, seq, what, res};
    char why[ERR_MSG_MAX];
    switch (frame_rd_pump(&x->rd, fd, 1, &ops, &k, why, sizeof why)) {
    case FRD_AGAIN:
    case FRD_ONE:
        return 0;
    case FRD_CLOSED:
    case FRD_BROKEN:
        closed_msg(p, what, seq, res, why);
        return -1;
    case FRD_BAD:
        set_res(res, CODE_INTERNAL, 0, "core %s/%d sent a bad frame: %s", p->host, p->core, why);
        return -1;
    default:
        return -1;
    }
}

static int do_write(struct xfer *x, int fd)
{
    while (!x->wdone) {
        const uint8_t *buf;
        size_t len;
        if (x->hput < x->hlen) {
            buf = x->hdr + x->hput;
            len = x->hlen - x->hput;
        } else {
            buf = x->in + x->in_put;
            len = x->in_len - x->in_put;
        }
        ssize_t n = len ? send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) : 0;
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return 0;
            return -1;
        }
        if (x->hput < x->hlen)
            x->hput += (size_t)n;
        else
            x->in_put += (size_t)n;
        if (x->hput == x->hlen && x->in_put == x->in_len)
            x->wdone = 1;
    }
    return 0;
}

size_t coll_io_run(tpu_cluster *c, const Tpuemu__CollSpec *spec, uint64_t seq, const char *what,
                   const struct cli_part *parts, uint64_t deadline_ms, uint64_t grace_ms)
{
    struct cli_coll *k = c->coll;
    size_t n = k->n, failed = 0, open_n = 0;
    struct xfer *xs = calloc(n, sizeof *xs);
    struct pollfd *pf = calloc(n, sizeof *pf);
    uint64_t end = deadline_ms, grace_used = 0;

    memset(k->res, 0, n * sizeof *k->res);
    if (!xs || !pf) {
        for (size_t r = 0; r < n; r++)
            set_res(&k->res[r], CODE_RESOURCE_EXHAUSTED, 0, "out of memory");
        free(xs);
        free(pf);
        return n;
    }
    for (size_t r = 0; r < n; r++) {
        Tpuemu__FrameHeader h = TPUEMU__FRAME_HEADER__INIT;
        h.kind = KIND(COLL);
        h.epoch = k->epoch;
        h.seq = seq;
        h.replica = (int32_t)r;
        h.dtype = (uint32_t)spec->dtype;
        h.coll = (Tpuemu__CollSpec *)spec;
        h.payload_bytes = parts[r].in_len;
        xs[r].hlen = frame_encode(&h, xs[r].hdr, sizeof xs[r].hdr);
        xs[r].in = parts[r].in;
        xs[r].in_len = parts[r].in_len;
        if (!xs[r].hlen)
            set_res(&k->res[r], CODE_INVALID_ARGUMENT, 0,
                    "the collective's description does not fit in a frame header (too many groups?)");
        else if (k->peers[r].fd < 0)
            set_res(&k->res[r], CODE_UNAVAILABLE, 0, "core %s/%d has no data connection", k->peers[r].host,
                    k->peers[r].core);
        else
            open_n++;
    }
    while (open_n > 0) {
        uint64_t now = wire_now_ms();
        size_t np = 0;
        int any_failed = 0;
        for (size_t r = 0; r < n; r++)
            if (k->res[r].mono_ms && k->res[r].code != CODE_OK)
                any_failed = 1;
        if (any_failed && grace_ms && now + grace_ms < end)
            end = now + grace_ms, grace_used = grace_ms, grace_ms = 0; /* once */
        if (now >= end)
            break;
        for (size_t r = 0; r < n; r++) {
            pf[r].fd = -1;
            pf[r].events = 0;
            pf[r].revents = 0;
            if (k->res[r].mono_ms && (xs[r].rd.rd == FRD_DONE || k->peers[r].fd < 0))
                continue;
            if (k->peers[r].fd < 0)
                continue;
            pf[r].fd = k->peers[r].fd;
            pf[r].events = POLLIN;
            if (!xs[r].wdone && !xs[r].wfailed)
                pf[r].events |= POLLOUT;
            np++;
        }
        if (!np)
            break;
        int rc = poll(pf, n, (int)(end - now));
        if (rc < 0 && errno != EINTR)
            break;
        for (size_t r = 0; r < n && rc > 0; r++) {
            struct xfer *x = &xs[r];
            struct cli_peer *p = &k->peers[r];
            if (pf[r].fd < 0 || !pf[r].revents)
                continue;
            if ((pf[r].revents & POLLOUT) && do_write(x, p->fd) < 0)
                x->wfailed = 1; /* keep reading: the core's ERROR says why */
            if ((pf[r].revents & (POLLIN | POLLHUP | POLLERR)) &&
                do_read(x, p->fd, p, &parts[r], seq, what, &k->res[r]) < 0) {
                coll_io_close(p);
                open_n--;
                continue;
            }
            if (x->rd.rd == FRD_DONE) {
                x->clean = x->wdone && !x->errframe;
                open_n--;
                pf[r].fd = -1;
            }
        }
    }
    for (size_t r = 0; r < n; r++) {
        struct cli_peer *p = &k->peers[r];
        if (!k->res[r].mono_ms) {
            if (grace_used)
                set_res(&k->res[r], CODE_UNAVAILABLE, 0,
                        "core %s/%d did not answer %s #%llu within %llu ms after another core failed "
                        "(it hangs or is cut off)",
                        p->host, p->core, what, (unsigned long long)seq, (unsigned long long)grace_used);
            else
                set_res(&k->res[r], CODE_DEADLINE_EXCEEDED, 0, "core %s/%d did not answer %s #%llu in time",
                        p->host, p->core, what, (unsigned long long)seq);
            k->res[r].mono_ms = 0; /* never answered */
        }
        if (k->res[r].code != CODE_OK)
            failed++;
        if (!xs[r].clean)
            coll_io_close(p);
    }
    free(xs);
    free(pf);
    return failed;
}
