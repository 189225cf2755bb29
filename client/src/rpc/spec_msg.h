/* The cluster spec (a ClusterSpec message, as tpu_cluster_spec_get holds
 * it) read as plain C, for the rooms above rpc. Never installed. */
#ifndef TPUEMU_CLIENT_SPEC_MSG_H
#define TPUEMU_CLIENT_SPEC_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"

/* A core of a cluster spec, as its control port is reached. */
struct spec_core {
    const char *control_addr; /* the spec's: valid while it is */
    uint64_t incarnation;
};

/* Core host/core of spec (the last the spec lists, with a control address):
 * 1 with *out set, else 0. */
int spec_find_core(const tpu_cluster_spec *spec, const char *host, int core, struct spec_core *out);
/* The cores the spec lists. */
size_t spec_ncores(const tpu_cluster_spec *spec);

/* Asks the resolver for the cluster spec (as TensorFlow's client words a
 * failed lookup when the handle names a TPU): *out the message, checked (a
 * description for every core), for tpu_cluster_spec; c->seen_epoch its
 * epoch. CODE_OK or the error. */
int spec_msg_fetch(tpu_cluster *c, wire_msg **out, err *e);

/* The system the spec describes; strings are the spec's ("" when unsaid). */
struct spec_system {
    int initialized;
    uint64_t epoch;
    uint32_t heartbeat_ms, dead_after;
    const char *owner, *resolver_version, *tpu_name;
};
void spec_system(const tpu_cluster_spec *spec, struct spec_system *out);

/* Core i (< spec_ncores) of the spec: its strings are the spec's, valid
 * while it is ("" when it did not say). */
struct spec_worker {
    const char *host_id, *data_addr, *control_addr, *tpu_type;
    int core;
    uint64_t epoch; /* the system epoch it was last reset into (0: never) */
    int replica_id; /* -1: in no system */
    int live;       /* IDLE or READY */
};
void spec_worker_at(const tpu_cluster_spec *spec, size_t i, struct spec_worker *out);
/* Core i (< spec_ncores) as the public API describes it. */
void spec_core_info(const tpu_cluster_spec *spec, size_t i, tpu_core_info *out);

#endif
