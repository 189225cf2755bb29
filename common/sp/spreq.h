/* A nanomsg-compatible REQ endpoint (the SP protocol over TCP, as sprep.h
 * describes it) on a libuv loop: one TCP connection, no nanomsg socket.
 *
 * The resolver keeps one of these per core to send it resets and probes.
 * nanomsg caps the sockets of a process (512 by default) and each of its
 * sockets takes about 3 descriptors and a share of its worker threads; this
 * takes one descriptor and nothing else, so the number of cores is bounded
 * by the open-file limit, not by a constant of the library.
 *
 * One request is outstanding at a time: spreq_send replaces an earlier one
 * whose reply has not come (a late reply to it is dropped, matched by the
 * request id). The connection is made on the first send (the host name
 * resolved then, so names that change, as in compose, are followed) and kept;
 * when it breaks it is made again on the next send. A request whose
 * connection breaks before its reply is NOT resent: on_lost tells the owner,
 * who may send it again (requests carry a nonce, and the far side refuses the
 * same bytes twice). Loop thread only. */
#ifndef TPUEMU_COMMON_SPREQ_H
#define TPUEMU_COMMON_SPREQ_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "status.h"

typedef struct spreq spreq;

struct spreq_cfg {
    size_t max_msg; /* largest reply body; a larger one breaks the connection */
    /* the reply to the outstanding request; body valid during the call only */
    void (*on_reply)(spreq *q, const uint8_t *body, size_t len);
    /* the outstanding request will get no reply: its connection failed or
     * broke (e says how, naming the address) */
    void (*on_lost)(spreq *q, const err *e);
    /* optional: the connection asked for by spreq_connect is made (the
     * owner may send now, from memory of its own, with nothing copied) */
    void (*on_open)(spreq *q);
    void *data; /* the owner's */
};

/* A link to url ("tcp://HOST:PORT", "HOST:PORT"); nothing is connected yet.
 * NULL with e set when the address does not parse or memory is short. */
spreq *spreq_new(uv_loop_t *loop, const char *url, const struct spreq_cfg *cfg, err *e);
/* Sends body as a new request (copied); connects first if need be. */
int spreq_send(spreq *q, const void *body, size_t len, err *e);
/* Makes the connection if there is none, with nothing to send yet: on_open
 * comes when it is made, on_lost if it cannot be. An owner that builds large
 * requests sends them from on_open instead of having spreq_send copy each
 * one for a connection still being made (a resolver resetting 1,024 cores
 * held a copy of every reset at once). */
int spreq_connect(spreq *q, err *e);
/* Is the connection made (a send goes out at once)? */
int spreq_is_open(const spreq *q);
/* Forgets the outstanding request: its reply, if it comes, is dropped. */
void spreq_cancel(spreq *q);
void *spreq_data(const spreq *q);
/* Closes the connection; no callback comes after this returns, and q is
 * freed once libuv lets go of its handles. */
void spreq_close(spreq *q);

#endif
