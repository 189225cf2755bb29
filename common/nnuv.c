/* nanomsg + libuv glue. */
#include "nnuv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nanomsg/nn.h>

#include "addr.h"

#define DRAIN_MAX 64

static void on_poll(uv_poll_t *h, int status, int events)
{
    nnuv *s = h->data;
    (void)events;
    if (status < 0)
        return;
    for (int i = 0; i < DRAIN_MAX && s->active; i++) {
        void *buf = NULL;
        void *ctl = NULL;
        struct nn_iovec iov = {&buf, NN_MSG};
        struct nn_msghdr hdr;
        memset(&hdr, 0, sizeof hdr);
        hdr.msg_iov = &iov;
        hdr.msg_iovlen = 1;
        if (s->raw) {
            hdr.msg_control = &ctl;
            hdr.msg_controllen = NN_MSG;
        }
        int n = nn_recvmsg(s->sock, &hdr, NN_DONTWAIT);
        if (n < 0)
            return; /* EAGAIN: drained; other errors: the socket is closing */
        s->on_msg(s, buf, (size_t)n, ctl);
        nn_freemsg(buf);
    }
}

int nnuv_start(uv_loop_t *loop, nnuv *s, int sock, int raw, nnuv_msg_cb cb, err *e)
{
    int fd;
    size_t sz = sizeof fd;
    int rc;

    if (nn_getsockopt(sock, NN_SOL_SOCKET, NN_RCVFD, &fd, &sz) < 0)
        return err_set(e, CODE_INTERNAL, "nanomsg NN_RCVFD: %s", nn_strerror(nn_errno()));
    s->sock = sock;
    s->raw = raw;
    s->on_msg = cb;
    if ((rc = uv_poll_init(loop, &s->poll, fd)) < 0)
        return err_set(e, CODE_INTERNAL, "uv_poll_init: %s", uv_strerror(rc));
    s->poll.data = s;
    s->active = 1;
    uv_poll_start(&s->poll, UV_READABLE, on_poll);
    return CODE_OK;
}

int nnuv_send(nnuv *s, const void *buf, size_t len, err *e)
{
    if (nn_send(s->sock, buf, len, NN_DONTWAIT) < 0)
        return err_set(e, CODE_UNAVAILABLE, "send: %s", nn_strerror(nn_errno()));
    return CODE_OK;
}

int nnuv_reply(nnuv *s, void *ctl, const void *buf, size_t len, err *e)
{
    struct nn_iovec iov = {(void *)buf, len};
    struct nn_msghdr hdr;
    memset(&hdr, 0, sizeof hdr);
    hdr.msg_iov = &iov;
    hdr.msg_iovlen = 1;
    if (s->raw) {
        hdr.msg_control = &ctl;
        hdr.msg_controllen = NN_MSG;
    }
    if (nn_sendmsg(s->sock, &hdr, NN_DONTWAIT) < 0) {
        int en = nn_errno();
        if (ctl && s->raw)
            nn_freemsg(ctl); /* not consumed on failure */
        return err_set(e, CODE_UNAVAILABLE, "reply: %s", nn_strerror(en));
    }
    return CODE_OK;
}

void nnuv_ctl_free(void *ctl)
{
    if (ctl)
        nn_freemsg(ctl);
}

static void on_poll_closed(uv_handle_t *h)
{
    nnuv *s = h->data;
    if (s->on_close)
        s->on_close(s);
}

void nnuv_close(nnuv *s, void (*on_close)(nnuv *s))
{
    s->active = 0;
    s->on_close = on_close;
    uv_poll_stop(&s->poll);
    /* close the poll handle first: the fd belongs to the nanomsg socket */
    uv_close((uv_handle_t *)&s->poll, on_poll_closed);
    nn_close(s->sock);
    s->sock = -1;
}

int nnuv_sockopts(int sock, size_t max_recv, err *e)
{
    int v = (int)max_recv, zero = 0;
    /* Not NN_IPV4ONLY=0 here: nanomsg 1.1.5 then aborts (usock_posix.inc:195
     * assertion) when a connecting socket reaches an IPv4 address. Bind and
     * connect turn IPv6 on only for IPv6 addresses (nnuv_bind_tcp, nnuv_connect). */
    if (nn_setsockopt(sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &v, sizeof v) < 0 ||
        nn_setsockopt(sock, NN_SOL_SOCKET, NN_LINGER, &zero, sizeof zero) < 0)
        return err_set(e, CODE_INTERNAL, "nanomsg setsockopt: %s", nn_strerror(nn_errno()));
    return CODE_OK;
}

/* Asks the kernel for a free TCP port on host. */
static int free_port(const char *host, int *port)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    int fd, rc = -1;

    memset(&ss, 0, sizeof ss);
    if (strchr(host, ':')) {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
        a6->sin6_family = AF_INET6;
        if (inet_pton(AF_INET6, host, &a6->sin6_addr) != 1)
            return -1;
        sl = sizeof *a6;
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
        a4->sin_family = AF_INET;
        if (strcmp(host, "*") == 0 || strcmp(host, "0.0.0.0") == 0)
            a4->sin_addr.s_addr = htonl(INADDR_ANY);
        else if (inet_pton(AF_INET, host, &a4->sin_addr) != 1)
            return -1;
        sl = sizeof *a4;
    }
    fd = socket(ss.ss_family, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&ss, sl) == 0 && getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
        rc = 0;
    }
    close(fd);
    return rc;
}

int nnuv_bind_tcp(int sock, const char *host, int port, int *port_out, err *e)
{
    char url[300];
    int tries = port ? 1 : 20, zero = 0;

    if (strchr(host, ':') && nn_setsockopt(sock, NN_SOL_SOCKET, NN_IPV4ONLY, &zero, sizeof zero) < 0)
        return err_set(e, CODE_INTERNAL, "nanomsg setsockopt: %s", nn_strerror(nn_errno()));

    for (int t = 0; t < tries; t++) {
        int p = port;
        if (!p && free_port(host, &p) < 0)
            return err_set(e, CODE_INVALID_ARGUMENT,
                           "cannot bind to address '%s': not a local IP address", host);
        addr_nn_url(host, p, url, sizeof url);
        if (nn_bind(sock, url) >= 0) {
            if (port_out)
                *port_out = p;
            return CODE_OK;
        }
        if (nn_errno() != EADDRINUSE || port)
            return err_set(e, nn_errno() == EADDRINUSE ? CODE_ALREADY_EXISTS : CODE_INVALID_ARGUMENT,
                           "cannot listen on %s: %s", url, nn_strerror(nn_errno()));
    }
    return err_set(e, CODE_UNAVAILABLE, "cannot find a free port on %s", host);
}

int nnuv_connect(int sock, const char *url, err *e)
{
    int zero = 0;
    if (strchr(url, '[') && nn_setsockopt(sock, NN_SOL_SOCKET, NN_IPV4ONLY, &zero, sizeof zero) < 0)
        return err_set(e, CODE_INTERNAL, "nanomsg setsockopt: %s", nn_strerror(nn_errno()));
    if (nn_connect(sock, url) < 0)
        return err_set(e, CODE_INVALID_ARGUMENT, "cannot connect to %s: %s", url, nn_strerror(nn_errno()));
    return CODE_OK;
}
