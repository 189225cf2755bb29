/* A blocking SP REQ client (see spcall.h). */
#include "spcall.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "addr.h"
#include "wire.h"

#define SP_PROTO_REQ 48 /* nanomsg NN_REQ */
#define SP_PROTO_REP 49 /* nanomsg NN_REP */
#define SP_HDR 8
#define SP_MAX_HOPS 8

static uint32_t left_ms(uint64_t deadline)
{
    uint64_t now = wire_now_ms();
    return now >= deadline ? 0 : (uint32_t)(deadline - now > 0x7fffffff ? 0x7fffffff : deadline - now);
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static uint64_t get_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

void spcall_init(spcall *c, size_t max_reply)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->max_reply = max_reply;
    c->wake_fd = -1;
    /* like nanomsg's REQ: a random start, so ids of a reopened client differ */
    c->next_id = (uint32_t)((uint64_t)time(NULL) * 2654435761u ^ (uint32_t)getpid() * 40503u);
}

void spcall_close(spcall *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

/* Waits for events on fd until the deadline or wake (-1: none) is readable:
 * 1 ready, 0 timed out, -1 error (errno; ECANCELED: woken). */
static int wait_fd(int fd, int wake, short events, uint64_t deadline)
{
    struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = wake, .events = POLLIN}};
    int rc;
    do {
        rc = poll(p, 2, (int)left_ms(deadline));
    } while (rc < 0 && errno == EINTR);
    if (rc > 0 && p[1].revents) {
        errno = ECANCELED;
        return -1;
    }
    return rc;
}

static int write_all(int fd, int wake, const uint8_t *p, size_t n, uint64_t deadline, int *en)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, wake, POLLOUT, deadline);
            if (rc == 0) {
                *en = ETIMEDOUT;
                return -1;
            }
            if (rc < 0) {
                *en = errno;
                return -1;
            }
            continue;
        }
        *en = w < 0 ? errno : EPIPE;
        return -1;
    }
    return 0;
}

/* Reads exactly n bytes; -1 with *en = 0 on an orderly close. */
static int read_all(int fd, int wake, uint8_t *p, size_t n, uint64_t deadline, int *en)
{
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0) {
            *en = 0;
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(fd, wake, POLLIN, deadline);
            if (rc == 0) {
                *en = ETIMEDOUT;
                return -1;
            }
            if (rc < 0) {
                *en = errno;
                return -1;
            }
            continue;
        }
        *en = errno;
        return -1;
    }
    return 0;
}

/* A non-blocking connect to sa within the deadline and the SP headers
 * traded; the descriptor, or -1 with *en set. */
static int dial(const struct sockaddr *sa, socklen_t sl, uint64_t deadline, int *en)
{
    static const uint8_t hdr[SP_HDR] = {0, 'S', 'P', 0, 0, SP_PROTO_REQ, 0, 0};
    uint8_t got[SP_HDR];
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;

    if (fd < 0) {
        *en = errno;
        return -1;
    }
    if (connect(fd, sa, sl) < 0) {
        if (errno != EINPROGRESS) {
            *en = errno;
            close(fd);
            return -1;
        }
        int rc = wait_fd(fd, -1, POLLOUT, deadline), soerr = 0;
        socklen_t l = sizeof soerr;
        if (rc <= 0) {
            *en = rc == 0 ? ETIMEDOUT : errno;
            close(fd);
            return -1;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &l) < 0 || soerr) {
            *en = soerr ? soerr : errno;
            close(fd);
            return -1;
        }
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (write_all(fd, -1, hdr, sizeof hdr, deadline, en) < 0 || read_all(fd, -1, got, sizeof got, deadline, en) < 0) {
        if (*en == 0)
            *en = ECONNRESET;
        close(fd);
        return -1;
    }
    if (got[0] != 0 || got[1] != 'S' || got[2] != 'P' || got[3] != 0 || got[4] != 0 || got[5] != SP_PROTO_REP) {
        *en = EPROTO;
        close(fd);
        return -1;
    }
    return fd;
}

static int dial_err(const spcall *c, int en, err *e)
{
    if (en == EPROTO)
        return err_set(e, CODE_UNAVAILABLE, "%s is not a tpuemu control endpoint (wrong protocol header)",
                       c->shown);
    if (en == ETIMEDOUT)
        return err_set(e, CODE_UNAVAILABLE, "%s did not answer in time", c->shown);
    return err_set(e, CODE_UNAVAILABLE, "cannot connect to %s: %s", c->shown, strerror(en));
}

int spcall_connect(spcall *c, const char *host, int port, uint32_t timeout_ms, int *sys_errno, err *e)
{
    struct addrinfo hints, *res = NULL, *ai;
    char ps[16];
    uint64_t deadline = wire_now_ms() + timeout_ms;
    int rc, en = 0, fd = -1;

    spcall_close(c);
    addr_format(host, port, c->shown, sizeof c->shown);
    if (sys_errno)
        *sys_errno = 0;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(ps, sizeof ps, "%d", port);
    if ((rc = getaddrinfo(host, ps, &hints, &res)) != 0) {
        if (sys_errno)
            *sys_errno = EHOSTUNREACH;
        return err_set(e, CODE_UNAVAILABLE, "cannot resolve %s: %s", c->shown, gai_strerror(rc));
    }
    for (ai = res; ai && fd < 0; ai = ai->ai_next) {
        int this_en = 0;
        fd = dial(ai->ai_addr, ai->ai_addrlen, deadline, &this_en);
        if (fd >= 0) {
            memcpy(&c->peer, ai->ai_addr, ai->ai_addrlen);
            c->peer_len = ai->ai_addrlen;
        } else if (!en || this_en == ECONNREFUSED) {
            en = this_en;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        if (sys_errno)
            *sys_errno = en;
        return dial_err(c, en, e);
    }
    c->fd = fd;
    return CODE_OK;
}

/* Sends the request on the current connection and reads until its reply:
 * CODE_OK, or -1 with *en set (0: the peer closed) when the connection
 * broke, or CODE_DEADLINE_EXCEEDED. */
static int exchange(spcall *c, uint32_t id, const void *body, size_t len, uint64_t deadline, uint8_t **reply,
                    size_t *reply_len, int *en, err *e)
{
    uint8_t hdr[SP_HDR + 4], lenb[8];

    put_be64(hdr, (uint64_t)len + 4);
    hdr[8] = (uint8_t)(id >> 24);
    hdr[9] = (uint8_t)(id >> 16);
    hdr[10] = (uint8_t)(id >> 8);
    hdr[11] = (uint8_t)id;
    if (write_all(c->fd, c->wake_fd, hdr, sizeof hdr, deadline, en) < 0 ||
        write_all(c->fd, c->wake_fd, body, len, deadline, en) < 0)
        return *en == ETIMEDOUT ? CODE_DEADLINE_EXCEEDED : *en == ECANCELED ? CODE_CANCELLED : -1;
    for (;;) {
        uint64_t n;
        uint8_t *msg;
        size_t k, hops = 0;
        uint32_t got;

        if (read_all(c->fd, c->wake_fd, lenb, sizeof lenb, deadline, en) < 0)
            return *en == ETIMEDOUT ? CODE_DEADLINE_EXCEEDED : *en == ECANCELED ? CODE_CANCELLED : -1;
        n = get_be64(lenb);
        if (n < 4 || n > c->max_reply + 4 * SP_MAX_HOPS) {
            spcall_close(c);
            return err_set(e, CODE_UNAVAILABLE, "%s sent a reply of %llu bytes (at most %zu taken)", c->shown,
                           (unsigned long long)n, c->max_reply);
        }
        if (!(msg = malloc((size_t)n))) {
            spcall_close(c);
            return err_set(e, CODE_RESOURCE_EXHAUSTED, "out of memory for a %llu-byte reply from %s",
                           (unsigned long long)n, c->shown);
        }
        if (read_all(c->fd, c->wake_fd, msg, (size_t)n, deadline, en) < 0) {
            free(msg);
            return *en == ETIMEDOUT ? CODE_DEADLINE_EXCEEDED : *en == ECANCELED ? CODE_CANCELLED : -1;
        }
        for (k = 0; k + 4 <= n && hops < SP_MAX_HOPS; k += 4, hops++)
            if (msg[k] & 0x80)
                break;
        if (k + 4 > n || hops >= SP_MAX_HOPS) {
            free(msg);
            spcall_close(c);
            return err_set(e, CODE_UNAVAILABLE, "%s sent a reply without a request id", c->shown);
        }
        got = (uint32_t)msg[k] << 24 | (uint32_t)msg[k + 1] << 16 | (uint32_t)msg[k + 2] << 8 | msg[k + 3];
        if (got != id) {
            free(msg); /* a late reply to a request given up on */
            continue;
        }
        memmove(msg, msg + k + 4, (size_t)n - k - 4);
        *reply = msg;
        *reply_len = (size_t)n - k - 4;
        return CODE_OK;
    }
}

int spcall_request(spcall *c, const void *body, size_t len, uint64_t deadline_ms, uint8_t **reply,
                   size_t *reply_len, err *e)
{
    uint32_t id = 0x80000000u | (c->next_id++ & 0x7fffffffu);
    int en = 0, rc, tries = 0;

    *reply = NULL;
    *reply_len = 0;
    for (;;) {
        if (c->fd < 0) {
            if (!c->peer_len)
                return err_set(e, CODE_UNAVAILABLE, "not connected");
            if ((c->fd = dial((struct sockaddr *)&c->peer, c->peer_len, deadline_ms, &en)) < 0) {
                if (en == ETIMEDOUT || !left_ms(deadline_ms))
                    return err_set(e, CODE_DEADLINE_EXCEEDED, "%s did not answer in time", c->shown);
                return dial_err(c, en, e);
            }
        }
        rc = exchange(c, id, body, len, deadline_ms, reply, reply_len, &en, e);
        if (rc == CODE_OK)
            return CODE_OK;
        if (rc == CODE_DEADLINE_EXCEEDED) {
            /* the reply may still come: this connection is not reused */
            spcall_close(c);
            return err_set(e, CODE_DEADLINE_EXCEEDED, "%s did not answer in time", c->shown);
        }
        if (rc == CODE_CANCELLED) {
            spcall_close(c); /* likewise */
            return err_set(e, CODE_CANCELLED, "the wait for %s was cancelled", c->shown);
        }
        if (rc != -1)
            return rc; /* a bad reply: e says which */
        /* broken before the reply: once more on a new connection (the peer
         * closes idle connections; the first try may meet one it closed) */
        spcall_close(c);
        if (++tries > 3 || !left_ms(deadline_ms))
            return err_set(e, CODE_UNAVAILABLE, "the connection to %s broke: %s", c->shown,
                           en ? strerror(en) : "closed by the peer");
    }
}
