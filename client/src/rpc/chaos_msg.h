/* Fault injection on the wire: InjectFault to a core's control port (over a
 * connection of its own for the one call) or to the resolver, the
 * ScheduledFaults listing and cancelling, so that the cluster room's
 * chaos.c builds no message. Never
 * installed. */
#ifndef TPUEMU_CLIENT_CHAOS_MSG_H
#define TPUEMU_CLIENT_CHAOS_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"
#include "spec_msg.h"

/* f into core host/core at w, with peer as the other end of a link fault
 * (peer_host NULL: none). CODE_OK or the error naming the core. */
int chaos_msg_inject(tpu_cluster *c, const struct spec_core *w, const char *host, int core, const tpu_fault *f,
                     const char *peer_host, int peer_core, err *e);
/* f into the resolver (tpu_inject_resolver_fault). */
int chaos_msg_inject_resolver(tpu_cluster *c, const tpu_fault *f, err *e);

/* A ScheduledFaults request to core host/core at w: cancels fault cancel
 * (0: none) or all of them (cancel_all), and lists those left: up to max
 * into out (elements of elem_size bytes), *n of them in all; *cancelled how
 * many went (either may be NULL). CODE_OK or the error naming the core. */
int chaos_msg_scheduled(tpu_cluster *c, const struct spec_core *w, const char *host, int core, uint32_t cancel,
                        int cancel_all, tpu_scheduled_fault *out, size_t max, size_t elem_size, size_t *n,
                        size_t *cancelled, err *e);

#endif
