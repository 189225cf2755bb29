/* Control: the worker's REP socket, where the resolver resets the core into a
 * system epoch (ResetCore) and the resolver or a peer asks whether it is still
 * alive (ProbeCore). Every request is opened with the cluster key and the
 * replay cache, and must name this core and process as its recipient
 * (PERMISSION_DENIED otherwise: the replay cache is per process, so a message
 * captured on its way to another core would pass it); anything else gets an
 * error reply and one warn line, never a crash, and changes nothing.
 * The port is served by sprep (common/sp/sprep.h) with a connection budget per
 * kind of peer, so strangers holding connections cannot keep the resolver's
 * resets and the peers' probes out.
 *
 * As the resolver's port does, it keeps the answer to every authenticated
 * request for the replay window (common/replycache/drc.h, bounded by
 * CTL_DRC_ENTRIES and CTL_DRC_BYTES): a byte-identical resend (what a client
 * whose connection broke before the reply came sends) gets the first answer
 * again, and nothing is done twice, instead of being refused as a replay. */
#ifndef TPUEMU_WORKER_CONTROL_H
#define TPUEMU_WORKER_CONTROL_H

#include <uv.h>

#include "auth.h"
#include "ident.h"
#include "sprep.h"
#include "status.h"
#include "tpuemu.pb-c.h"

/* What the control socket needs from its owner; every pointer must outlive it. */
struct ctl_env {
    uv_loop_t *loop;
    const auth *auth;
    replay *replay;                  /* requests seen, refused when replayed */
    const char *listen;              /* local address to bind */
    const struct core_ident *id;     /* sender of the replies */
    /* ResetCore, already authenticated: CODE_OK, or an error code with e set
     * (the reply says so and nothing changed). */
    int (*reset)(void *arg, const Tpuemu__ResetCore *r, err *e);
    /* InjectFault, already authenticated: CODE_OK once it is scheduled (it
     * takes effect after the reply is on its way), else an error code with e
     * set and nothing injected. */
    int (*fault)(void *arg, const Tpuemu__InjectFault *f, err *e);
    /* ScheduledFaults: lists (after cancelling) the faults waiting on the
     * core into report, or an error code with e set. */
    int (*faults)(void *arg, const Tpuemu__ScheduledFaults *q, Tpuemu__CoreReport *report, err *e);
    /* Fills out (an initialized WorkerInfo) for a CoreReport. */
    void (*info)(void *arg, Tpuemu__WorkerInfo *out);
    void *arg;
};

/* Connections: those that sent an authenticated request (the resolver, peers
 * probing) and those that have not yet (anyone's), each within its own bound. */
#define CTL_MAX_TRUSTED 1024u
#define CTL_MAX_UNTRUSTED 64u
#define CTL_UNTRUSTED_MS 10000u /* to send an authenticated request, from connect */
#define CTL_IDLE_MS 120000u     /* an authenticated connection silent this long is closed */
#define CTL_DRC_ENTRIES 1024u   /* answers kept for resends */
#define CTL_DRC_BYTES (1u << 20)

struct control {
    struct ctl_env env;
    sprep *sock;
    struct drc *drc;  /* the answers kept for resends */
    uint64_t resends; /* resends answered again */
    int started;
    int port;
};

/* Listens on env->listen, port chosen by the kernel (ctl->port). */
int ctl_start(struct control *ctl, const struct ctl_env *env, err *e);
void ctl_stop(struct control *ctl);

#endif
