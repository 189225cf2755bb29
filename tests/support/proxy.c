/* The fault-injecting control-plane proxy: one thread, poll(), blocking
 * writes (loopback, small frames). */
#include "proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PX_MAX_CONNS 16
#define PX_MAX_FRAME (4u * 1024u * 1024u)

struct pdir {
    uint8_t *buf;
    size_t len, cap;
    int hdr_done;
};

struct pconn {
    int cfd, sfd;        /* client side, target side; -1 when unused */
    struct pdir d[2];    /* 0: client -> target, 1: target -> client */
    uint8_t *last_req;   /* body of the last request forwarded */
    size_t last_len;
};

struct proxy {
    pthread_t thread;
    pthread_mutex_t mu;
    int stop;
    int lfd;
    struct sockaddr_in target;
    char addr[64];
    struct pconn c[PX_MAX_CONNS];
    struct proxy_stats st;
    int drop;                 /* replies still to drop */
    uint8_t *inject;          /* body of the reply to inject; NULL: none */
    size_t inject_len;
    int respond;              /* requests still to answer with responder */
    proxy_responder responder;
    void *responder_arg;
    uint8_t *dropped_req;     /* request whose reply was dropped last */
    size_t dropped_len;
};

static int send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *b = buf;
    while (len > 0) {
        ssize_t n = send(fd, b, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        b += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Sends body to the client as the reply to the request whose SP id is at id. */
static int send_reply(int fd, const uint8_t *id, const uint8_t *body, size_t len)
{
    size_t fl = 4 + len;
    uint8_t *f = malloc(8 + fl);
    int rc;
    if (!f)
        return -1;
    for (int i = 7; i >= 0; i--)
        f[7 - i] = (uint8_t)(fl >> (8 * i));
    memcpy(f + 8, id, 4);
    memcpy(f + 12, body, len);
    rc = send_all(fd, f, 8 + fl);
    free(f);
    return rc;
}

static void reset_fd(int fd)
{
    struct linger l = {1, 0};
    if (fd < 0)
        return;
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
}

static void conn_close(struct pconn *c)
{
    reset_fd(c->cfd);
    reset_fd(c->sfd);
    for (int i = 0; i < 2; i++)
        free(c->d[i].buf);
    free(c->last_req);
    memset(c, 0, sizeof *c);
    c->cfd = c->sfd = -1;
}

static uint64_t be64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | b[i];
    return v;
}

/* Acts on every complete unit buffered in direction k; -1 when the
 * connection was closed. Called with p->mu held. */
static int process(proxy *p, struct pconn *c, int k)
{
    struct pdir *d = &c->d[k];
    int out = k == 0 ? c->sfd : c->cfd;

    for (;;) {
        size_t unit;
        if (!d->hdr_done) {
            if (d->len < 8)
                return 0;
            if (send_all(out, d->buf, 8) < 0)
                return -1;
            d->hdr_done = 1;
            unit = 8;
        } else {
            if (d->len < 8)
                return 0;
            uint64_t flen = be64(d->buf);
            if (flen > PX_MAX_FRAME || flen < 4)
                return -1;
            if (d->len < 8 + flen)
                return 0;
            const uint8_t *pl = d->buf + 8;
            unit = 8 + (size_t)flen;
            if (k == 0) {
                const uint8_t *body = pl + 4;
                size_t blen = (size_t)flen - 4;
                if (p->dropped_req && blen == p->dropped_len && memcmp(body, p->dropped_req, blen) == 0)
                    p->st.resent++;
                uint8_t *own = NULL;
                size_t olen = 0;
                if (!p->inject && p->respond > 0 && (own = p->responder(body, blen, p->responder_arg, &olen)))
                    p->respond--;
                if (p->inject || own) {
                    int rc = own ? send_reply(c->cfd, pl, own, olen)
                                 : send_reply(c->cfd, pl, p->inject, p->inject_len);
                    if (own) {
                        free(own);
                    } else {
                        free(p->inject);
                        p->inject = NULL;
                    }
                    p->st.injected++;
                    if (rc < 0)
                        return -1;
                } else {
                    if (send_all(out, d->buf, unit) < 0)
                        return -1;
                    p->st.requests++;
                    free(c->last_req);
                    c->last_req = malloc(blen ? blen : 1);
                    if (c->last_req)
                        memcpy(c->last_req, body, blen);
                    c->last_len = blen;
                }
            } else if (p->drop > 0) {
                p->drop--;
                p->st.dropped++;
                free(p->dropped_req);
                p->dropped_req = c->last_req;
                p->dropped_len = c->last_len;
                c->last_req = NULL;
                conn_close(c);
                return -1;
            } else {
                if (send_all(out, d->buf, unit) < 0)
                    return -1;
                p->st.replies++;
            }
        }
        memmove(d->buf, d->buf + unit, d->len - unit);
        d->len -= unit;
    }
}

static void accept_one(proxy *p)
{
    int cfd = accept(p->lfd, NULL, NULL), sfd;
    struct pconn *c = NULL;
    if (cfd < 0)
        return;
    for (int i = 0; i < PX_MAX_CONNS; i++)
        if (p->c[i].cfd < 0) {
            c = &p->c[i];
            break;
        }
    sfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (!c || sfd < 0 || connect(sfd, (struct sockaddr *)&p->target, sizeof p->target) < 0) {
        reset_fd(cfd);
        if (sfd >= 0)
            close(sfd);
        return;
    }
    c->cfd = cfd;
    c->sfd = sfd;
    p->st.accepted++;
}

static int readin(proxy *p, struct pconn *c, int k)
{
    struct pdir *d = &c->d[k];
    if (d->cap - d->len < 65536) {
        size_t ncap = d->cap ? d->cap * 2 : 131072;
        uint8_t *nb;
        if (ncap > 2 * PX_MAX_FRAME || !(nb = realloc(d->buf, ncap)))
            return -1;
        d->buf = nb;
        d->cap = ncap;
    }
    ssize_t n = recv(k == 0 ? c->cfd : c->sfd, d->buf + d->len, d->cap - d->len, 0);
    if (n < 0 && errno == EINTR)
        return 0;
    if (n <= 0)
        return -1;
    d->len += (size_t)n;
    return process(p, c, k);
}

static void *run(void *arg)
{
    proxy *p = arg;
    for (;;) {
        struct pollfd fds[1 + 2 * PX_MAX_CONNS];
        int who[1 + 2 * PX_MAX_CONNS];
        int n = 0;

        pthread_mutex_lock(&p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        fds[n].fd = p->lfd;
        fds[n].events = POLLIN;
        who[n++] = -1;
        for (int i = 0; i < PX_MAX_CONNS; i++) {
            if (p->c[i].cfd < 0)
                continue;
            for (int k = 0; k < 2; k++) {
                fds[n].fd = k == 0 ? p->c[i].cfd : p->c[i].sfd;
                fds[n].events = POLLIN;
                who[n++] = i * 2 + k;
            }
        }
        pthread_mutex_unlock(&p->mu);
        if (poll(fds, (nfds_t)n, 20) <= 0)
            continue;
        pthread_mutex_lock(&p->mu);
        for (int j = 0; j < n; j++) {
            if (!(fds[j].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (who[j] < 0) {
                accept_one(p);
                continue;
            }
            struct pconn *c = &p->c[who[j] / 2];
            if (c->cfd < 0 || fds[j].fd != (who[j] % 2 == 0 ? c->cfd : c->sfd))
                continue; /* closed (and maybe reused) earlier in this round */
            if (readin(p, c, who[j] % 2) < 0 && c->cfd >= 0)
                conn_close(c);
        }
        pthread_mutex_unlock(&p->mu);
    }
}

proxy *proxy_start(const char *target)
{
    proxy *p = calloc(1, sizeof *p);
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    const char *colon = target ? strrchr(target, ':') : NULL;
    int one = 1;

    if (!p || !colon)
        goto fail;
    for (int i = 0; i < PX_MAX_CONNS; i++)
        p->c[i].cfd = p->c[i].sfd = -1;
    p->target.sin_family = AF_INET;
    p->target.sin_port = htons((uint16_t)atoi(colon + 1));
    p->target.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (p->lfd < 0)
        goto fail;
    setsockopt(p->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(p->lfd, (struct sockaddr *)&a, sizeof a) < 0 || listen(p->lfd, 16) < 0 ||
        getsockname(p->lfd, (struct sockaddr *)&a, &al) < 0)
        goto fail_fd;
    snprintf(p->addr, sizeof p->addr, "127.0.0.1:%d", ntohs(a.sin_port));
    pthread_mutex_init(&p->mu, NULL);
    if (pthread_create(&p->thread, NULL, run, p) != 0) {
        pthread_mutex_destroy(&p->mu);
        goto fail_fd;
    }
    return p;
fail_fd:
    close(p->lfd);
fail:
    free(p);
    return NULL;
}

void proxy_free(proxy *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    for (int i = 0; i < PX_MAX_CONNS; i++)
        if (p->c[i].cfd >= 0)
            conn_close(&p->c[i]);
    close(p->lfd);
    free(p->inject);
    free(p->dropped_req);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

const char *proxy_addr(const proxy *p)
{
    return p->addr;
}

void proxy_drop_replies(proxy *p, int n)
{
    pthread_mutex_lock(&p->mu);
    p->drop += n;
    pthread_mutex_unlock(&p->mu);
}

void proxy_inject_reply(proxy *p, const void *body, size_t len)
{
    uint8_t *b = malloc(len ? len : 1);
    if (!b)
        return;
    memcpy(b, body, len);
    pthread_mutex_lock(&p->mu);
    free(p->inject);
    p->inject = b;
    p->inject_len = len;
    pthread_mutex_unlock(&p->mu);
}

void proxy_respond(proxy *p, int n, proxy_responder fn, void *arg)
{
    pthread_mutex_lock(&p->mu);
    p->respond = n;
    p->responder = fn;
    p->responder_arg = arg;
    pthread_mutex_unlock(&p->mu);
}

void proxy_get_stats(proxy *p, struct proxy_stats *s)
{
    pthread_mutex_lock(&p->mu);
    *s = p->st;
    pthread_mutex_unlock(&p->mu);
}
