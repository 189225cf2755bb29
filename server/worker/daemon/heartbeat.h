/* Heartbeat: the worker's REQ socket to the resolver. Each tick sends a fresh
 * Heartbeat carrying the whole WorkerInfo, so a restarted resolver relearns
 * this core from the next tick. An unanswered request is cancelled by closing
 * the socket and dialing again rather than by sending on top of it: nanomsg
 * 1.1.5's REQ frees a late reply to a cancelled request twice (it aborts at
 * nn_close), so a late reply must never reach a REQ socket we keep. The
 * reply assigns the core index and the interval. Errors the worker cannot fix
 * by retrying (duplicate core, wrong token, version, invalid settings) stop
 * the daemon with exit status 3. */
#ifndef TPUEMU_WORKER_HEARTBEAT_H
#define TPUEMU_WORKER_HEARTBEAT_H

#include <stdint.h>

#include <uv.h>

#include "nnuv.h"
#include "status.h"

struct worker;

struct heartbeat {
    nnuv *sock;           /* current REQ socket; a replaced one frees itself on close */
    uv_timer_t timer;
    int started;
    uint64_t last_nonce;  /* of the request in flight; 0: none */
    unsigned unanswered;  /* ticks in a row without a reply */
    int registered;       /* got a HeartbeatReply since start */
    int unreachable;      /* "resolver unreachable" was logged */
    int last_error;       /* code of the last error reply, to log changes once */
};

/* Connects to w->resolver_url and sends the first heartbeat at once. */
int hb_start(struct worker *w, err *e);
void hb_stop(struct worker *w);

#endif
