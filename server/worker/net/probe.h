/* probe: asks a peer's control socket whether its process is still there
 * (ProbeCore over nanomsg, answered by the peer's loop), with a deadline. A
 * link that hears nothing from a peer probes it before blaming it: a peer that
 * answers is alive and merely has not got this far (its client has not sent it
 * the collective yet, or it waits on someone else), so only a core that is
 * dead, stopped or cut off is ever named as the cause. */
#ifndef TPUEMU_WORKER_NET_PROBE_H
#define TPUEMU_WORKER_NET_PROBE_H

#include <stdint.h>

#include <uv.h>

#include "auth.h"
#include "status.h"

struct probe;

/* alive: the peer answered with the expected incarnation before the deadline. */
typedef void (*probe_cb)(void *arg, int alive);

/* Starts a probe of core host/core, process incarnation (the probe names it
 * as its recipient); cb runs exactly once from the loop unless probe_cancel()
 * is called first. NULL with e set if it cannot even start (then cb never runs). */
struct probe *probe_start(uv_loop_t *loop, const auth *a, const char *sender, const char *control_addr,
                          const char *host, int core, uint64_t incarnation, unsigned timeout_ms, probe_cb cb,
                          void *arg, err *e);
/* No callback after this; the probe frees itself. */
void probe_cancel(struct probe *pr);

#endif
