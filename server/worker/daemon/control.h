/* Control: the worker's REP socket, where the resolver resets the core into a
 * system epoch (ResetCore) and asks whether it is still alive (ProbeCore).
 * Every request is opened with the cluster key and the replay cache; anything
 * else gets an error reply and one warn line, never a crash. */
#ifndef TPUEMU_WORKER_CONTROL_H
#define TPUEMU_WORKER_CONTROL_H

#include "nnuv.h"
#include "status.h"

struct worker;

struct control {
    nnuv sock;
    int started;
    int port;
};

/* Binds a REP socket on w->listen, port chosen by the kernel (ctl.port). */
int ctl_start(struct worker *w, err *e);
void ctl_stop(struct worker *w);

#endif
