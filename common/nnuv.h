/* nanomsg sockets joined to a libuv loop: a uv_poll_t on the socket's NN_RCVFD,
 * drained with non-blocking receives until "would block" (a bounded number per
 * wake-up, so one busy peer cannot starve the loop). Loop thread only. */
#ifndef TPUEMU_COMMON_NNUV_H
#define TPUEMU_COMMON_NNUV_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "status.h"

typedef struct nnuv nnuv;

/* Called once per received message. buf is valid only during the call. For a raw
 * socket (AF_SP_RAW REP) ctl is the routing header of the request: the callee
 * owns it and must hand it to exactly one nnuv_reply() or nnuv_ctl_free(), now
 * or later, which lets a reply wait (for example, for an initialize). */
typedef void (*nnuv_msg_cb)(nnuv *s, const uint8_t *buf, size_t len, void *ctl);

struct nnuv {
    uv_poll_t poll;
    int sock;
    int raw;
    int active;
    nnuv_msg_cb on_msg;
    void (*on_close)(nnuv *s);
    void *data; /* the owner's */
};

/* Starts polling an already bound/connected nanomsg socket; s owns it from here. */
int nnuv_start(uv_loop_t *loop, nnuv *s, int sock, int raw, nnuv_msg_cb cb, err *e);

/* Sends without blocking. On a raw socket ctl is the request's header (consumed). */
int nnuv_send(nnuv *s, const void *buf, size_t len, err *e);
int nnuv_reply(nnuv *s, void *ctl, const void *buf, size_t len, err *e);
void nnuv_ctl_free(void *ctl);

/* Stops polling, closes the nanomsg socket, and calls on_close (may be NULL)
 * from the handle's close callback, when s may be freed. */
void nnuv_close(nnuv *s, void (*on_close)(nnuv *s));

/* Sets the options every tpuemu socket gets: receive size cap, linger 0 (never
 * block at close). IPv6 is turned on per address by nnuv_bind_tcp/nnuv_connect. */
int nnuv_sockopts(int sock, size_t max_recv, err *e);

/* nn_connect to a tcp:// URL, allowing IPv6 when the URL's host is one
 * ("tcp://[::1]:8470"). Use it for every connect: see nnuv_sockopts(). */
int nnuv_connect(int sock, const char *url, err *e);

/* Binds a raw or cooked socket to tcp://host:port; port 0 picks a free one (nanomsg
 * cannot report the port it got, so we ask the kernel for a free port and retry
 * if someone takes it first). Writes the chosen port to *port_out. */
int nnuv_bind_tcp(int sock, const char *host, int port, int *port_out, err *e);

#endif
