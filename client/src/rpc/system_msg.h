/* The TPU system's control calls on the wire: initialize (and abandoning
 * one that was cancelled), the epoch check, shutdown, forgetting a dead
 * core, and the topology an initialize answers with, read as plain C, so
 * that the cluster room's system.c builds no message. Never installed. */
#ifndef TPUEMU_CLIENT_SYSTEM_MSG_H
#define TPUEMU_CLIENT_SYSTEM_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"
#include "topo_msg.h"

/* What an initialize asks the resolver for (tpu_init_options). */
struct sys_init {
    uint32_t expect, timeout_ms;
    int allow_partial, keep_scheduled_faults;
    uint64_t abandon_request_id; /* not 0: drop that initialize instead (a cancelled one) */
};

/* Initialize, waiting up to wait_ms for the answer: *out a topology handle
 * holding the answer (checked: every core listed), for cli_topology_build.
 * CODE_OK or the error (CODE_CANCELLED after tpu_cancel; c->last_request_id
 * then names the request to abandon). */
int system_msg_initialize(tpu_cluster *c, const struct sys_init *in, uint32_t wait_ms, tpu_topology **out, err *e);
/* Drops the initialize request_id at the resolver, best effort (no answer
 * expected but an error). */
void system_msg_abandon(tpu_cluster *c, uint64_t request_id, uint32_t wait_ms);
/* The epoch check; *epoch the resolver's current one (unchanged when it did not say). */
int system_msg_check(tpu_cluster *c, uint64_t epoch, uint64_t *seen, err *e);
/* Shutdown of the system of epoch; *seen as for system_msg_check. */
int system_msg_shutdown(tpu_cluster *c, uint64_t epoch, uint64_t *seen, err *e);
/* Forgets core host/core; *silent_ms how long it had been silent. */
int system_msg_forget(tpu_cluster *c, const char *host_id, int core, uint64_t *silent_ms, err *e);

#endif
