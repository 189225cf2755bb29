/* libtpuclient internals shared by its modules: the handle structs, the
 * thread-local last error and the one request/reply call. Never installed. */
#ifndef TPUEMU_CLIENT_INTERNAL_H
#define TPUEMU_CLIENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "addr.h"
#include "spcall.h"
#include "auth.h"
#include "cancel.h"
#include "status.h"
#include "tpuemu/data.h"
#include "tpuemu/tpuemu.h"
#include "wire.h"

#define CLI_MAX_ENDPOINTS 16
#define CLI_DEFAULT_TIMEOUT_MS 5000u
#define CLI_INIT_DEFAULT_TIMEOUT_MS 10000u
#define CLI_INIT_EXTRA_MS 5000u

#define MAGIC_RESOLVER 0x74707572u /* "tpur" */
#define MAGIC_CLUSTER 0x74707563u  /* "tpuc" */
#define MAGIC_SPEC 0x74707573u     /* "tpus" */
#define MAGIC_TOPOLOGY 0x74707574u /* "tput" */
#define MAGIC_DEAD 0xdeadbeefu

struct tpu_resolver {
    uint32_t magic;
    addr eps[CLI_MAX_ENDPOINTS];
    char ep_str[CLI_MAX_ENDPOINTS][ADDR_HOST_MAX + 16]; /* "host:port" */
    size_t n;
    char master[ADDR_HOST_MAX + 24];                    /* "grpc://host:port" */
    /* TPU_NAME a bare word: the TPU node name, looked up at the Cloud TPU API
     * (the resolver at eps[0]: $TPUEMU_TPU_API); "" for an address or a list */
    char tpu_name[64];
    /* eps[i] was a bare word in a comma list (no port, scheme or brackets):
     * taken as a host with the default port, as TensorFlow takes it */
    unsigned char list_word[CLI_MAX_ENDPOINTS];
    auth auth;
    uint32_t timeout_ms;
    char client_id[300]; /* "PID@HOST" */
    char sender[310];    /* "client PID@HOST" */
};

struct tpu_cluster {
    uint32_t magic;
    tpu_resolver *r;
    size_t ep;         /* index of the endpoint in use */
    spcall call;       /* the connection to it (SP REQ) */
    uint64_t epoch;    /* epoch this handle initialized, 0: never */
    uint64_t seen_epoch;
    struct cli_coll *coll; /* collectives: the system's cores and data connections (coll.h) */
    /* Frees coll (set with it by coll.c, which is built on this handle: the
     * handle frees what is attached to it without calling up into coll.c). */
    void (*coll_free)(tpu_cluster *c);
    struct cli_cancel cancel; /* tpu_cancel (cancel.h) */
    uint64_t last_request_id; /* of the last request sent (call.c) */
};

/* The rest of the enclosing block is a call on cluster C that tpu_cancel(C)
 * may cancel (every public call that can block on the cluster begins so). */
#define CLI_CALL(C) CLI_CANCEL_SCOPE(&(C)->cancel)

#define CLI_TASK_ADDR_MAX (ADDR_HOST_MAX + 16)

struct tpu_cluster_spec {
    uint32_t magic;
    wire_msg *m; /* body: cluster_spec */
    /* TensorFlow's ClusterSpec: job "worker", one task per host ("HOST:PORT") */
    char (*tasks)[CLI_TASK_ADDR_MAX];
    size_t ntasks;
};

struct tpu_topology {
    uint32_t magic;
    struct topo_msgs *msgs; /* the parsed messages (rpc/topo_msg.c) */
    /* TensorFlow's view (topology.c: cli_topology_build) */
    int mesh[4];
    int ntasks, per;            /* device_coordinates' shape; per 0 when hosts differ */
    int *dc;                    /* [ntasks][per][4], NULL when hosts differ */
    char dc_why[256];           /* why dc is NULL */
    int *at_task, *at_dev;      /* mesh place -> task, device; -1: none */
    size_t nplaces, nmissing_dev;
    uint8_t *ser;               /* serialized TopologyProto (built on first use) */
    size_t nser;
};

/* CODE_CANCELLED naming what was cancelled ("all-reduce #12"), for e. */
int cli_cancelled(const char *what, err *e);
/* Sleeps ms on c's behalf; CODE_CANCELLED (e says so) if tpu_cancel cut it short. */
int cli_sleep(tpu_cluster *c, uint64_t ms, const char *what, err *e);

/* Aborts with a message when h is not a live handle of that kind (a bug). */
void cli_check_magic(const void *h, uint32_t magic, const char *what);
#define CHECK_HANDLE(h, M, what) cli_check_magic((h), (M), (what))

/* Records e as this thread's last error and returns its code. */
tpu_status cli_fail(const err *e);
tpu_status cli_failf(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Emits a warning through the handler of tpu_set_warning_handler (warn.c). */
void cli_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
