/* libtpuclient: connect to an emulated TPU cluster, read its spec, initialize and
 * shut down the TPU system, as TensorFlow's TPUClusterResolver,
 * experimental_connect_to_cluster and initialize_tpu_system do.
 *
 *   tpu_resolver *r;  tpu_cluster *c;  tpu_topology *t;
 *   if (tpu_resolver_new(NULL, &r)                      // $TPU_NAME, else 127.0.0.1:8470
 *       || tpu_connect_to_cluster(r, &c)
 *       || tpu_initialize_system(c, NULL, &t))
 *       fprintf(stderr, "%s: %s\n", tpu_status_name(tpu_last_status()), tpu_last_error());
 *
 * Conventions
 * - Every call returns a tpu_status; TPU_OK is 0. On failure tpu_last_error()
 *   holds a message saying what happened, where, and what to do. It is kept per
 *   thread and stays valid until the next call of this library on that thread.
 * - Handles are opaque, made by tpu_X_new (or a call that returns one) and freed
 *   by tpu_X_free, which accepts NULL. Passing a freed or foreign pointer is
 *   detected by a magic number and aborts with a message, as a bug should.
 * - A handle may be used by one thread at a time (tpu_cancel excepted);
 *   different handles may be used by different threads at once.
 * - Calls that talk to the cluster block, each with a deadline: nothing waits
 *   forever, and tpu_cancel (from another thread or a signal handler) makes
 *   the call in progress return TPU_CANCELLED at once. The library never
 *   prints and never exits.
 */
#ifndef TPUEMU_TPUEMU_H
#define TPUEMU_TPUEMU_H

#include <stddef.h>
#include <stdint.h>

#include "tpuemu/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TPU_BUILDING_LIBRARY)
#define TPU_API __attribute__((visibility("default")))
#else
#define TPU_API
#endif

/* Canonical codes, numbered as gRPC and TensorFlow number them. Only grows. */
typedef enum tpu_status {
    TPU_OK = 0,
    TPU_CANCELLED = 1,
    TPU_UNKNOWN = 2,
    TPU_INVALID_ARGUMENT = 3,
    TPU_DEADLINE_EXCEEDED = 4,
    TPU_NOT_FOUND = 5,
    TPU_ALREADY_EXISTS = 6,
    TPU_PERMISSION_DENIED = 7,
    TPU_RESOURCE_EXHAUSTED = 8,
    TPU_FAILED_PRECONDITION = 9,
    TPU_ABORTED = 10,
    TPU_OUT_OF_RANGE = 11,
    TPU_UNIMPLEMENTED = 12,
    TPU_INTERNAL = 13,
    TPU_UNAVAILABLE = 14,
    TPU_DATA_LOSS = 15,
    TPU_UNAUTHENTICATED = 16,
    /* not a gRPC code: fit stopped for a preemption or maintenance notice
     * after saving its checkpoint (tpu_fit_options.preemption_checkpoint) */
    TPU_PREEMPTED = 17,
} tpu_status;

/* "UNAVAILABLE". Never NULL. */
TPU_API const char *tpu_status_name(tpu_status s);
/* Status and message of this thread's last failed call ("" / TPU_OK if none). */
TPU_API tpu_status tpu_last_status(void);
TPU_API const char *tpu_last_error(void);
/* Version of the library as loaded at run time ("0.1.0"); compare with
 * TPUEMU_VERSION_STRING from tpuemu/version.h, the one compiled against. */
TPU_API const char *tpu_version(void);
/* The running library's TPUEMU_VERSION_NUMBER (MAJOR * 10000 + MINOR * 100 +
 * PATCH), to compare with the one compiled against. */
TPU_API int tpu_version_number(void);

/* ---- resolver: where the cluster is (no network traffic) ---- */

typedef struct tpu_resolver tpu_resolver;

/* tpu, as TensorFlow's TPUClusterResolver(tpu=...) and $TPU_NAME:
 * - "HOST:PORT" or "grpc://HOST:PORT" (port 8470 if none): the resolver there;
 * - a comma list "grpc://10.0.0.2:8470,grpc://10.0.0.3:8470": every host of
 *   the slice, task 0 first; the client talks to the first (the master) and
 *   the cluster spec's tasks are the list as given;
 * - a bare word "my-tpu": a TPU node name, looked up when connecting at the
 *   Cloud TPU API, here the resolver at $TPUEMU_TPU_API (HOST:PORT, default
 *   127.0.0.1:8470) started with --name my-tpu; another name is TPU_NOT_FOUND.
 * NULL or "" means $TPU_NAME, and 127.0.0.1:8470 when that is unset too. The
 * cluster token is read from $TPUEMU_TOKEN_FILE or $TPUEMU_TOKEN if set; see
 * tpu_resolver_set_token_file(). Errors: TPU_INVALID_ARGUMENT. */
TPU_API tpu_status tpu_resolver_new(const char *tpu, tpu_resolver **out);
TPU_API void tpu_resolver_free(tpu_resolver *r);

/* Uses the token in path (trailing newline ignored) for every message. */
TPU_API tpu_status tpu_resolver_set_token_file(tpu_resolver *r, const char *path);
/* Per-call deadline for calls through this resolver (default 5000 ms). */
TPU_API tpu_status tpu_resolver_set_timeout_ms(tpu_resolver *r, uint32_t ms);

/* "grpc://HOST:PORT" of the first endpoint, as TPUClusterResolver.master().
 * Owned by r. */
TPU_API const char *tpu_resolver_master(const tpu_resolver *r);
TPU_API size_t tpu_resolver_num_endpoints(const tpu_resolver *r);
/* "HOST:PORT" of endpoint i, or NULL. Owned by r. (A comma list: each
 * host's; a TPU name: the Cloud TPU API's.) */
TPU_API const char *tpu_resolver_endpoint(const tpu_resolver *r, size_t i);
/* The TPU node name tpu gave ("my-tpu"), or NULL for an address. Owned by r. */
TPU_API const char *tpu_resolver_tpu_name(const tpu_resolver *r);

/* ---- cluster: a connection to the resolver ---- */

typedef struct tpu_cluster tpu_cluster;

/* Connects (experimental_connect_to_cluster) to the first endpoint (for a
 * TPU name: looks it up there) and checks that the resolver answers and
 * accepts our token. r must outlive the cluster.
 * Errors: TPU_UNAVAILABLE (it did not answer in time), TPU_UNAUTHENTICATED
 * (wrong or missing token), TPU_NOT_FOUND (no TPU of that name: "Could not
 * lookup TPU metadata from name 'NAME'. Please doublecheck the tpu argument
 * in the TPUClusterResolver constructor. Exception: ..."). */
TPU_API tpu_status tpu_connect_to_cluster(tpu_resolver *r, tpu_cluster **out);
TPU_API void tpu_cluster_free(tpu_cluster *c);

/* Cancels the blocking call in progress on c, or on a strategy or model built
 * on c (tpu_initialize_system, the collectives, tpu_model_fit, evaluate and
 * predict, a strategy's steps, tpu_profile_capture, any call that waits for
 * the resolver or the cores): every wait of the library wakes at once and
 * the call returns TPU_CANCELLED; a TCP connect under way finishes first
 * (at most its 5 s). The handle and its cluster stay usable:
 * - an initialize still waiting for cores is dropped at the resolver;
 * - the all-reduce's cores finish or drop that collective by themselves; the
 *   next one runs on fresh connections;
 * - fit, evaluate and predict post no more steps and let those in flight
 *   finish on every replica (up to 2 s): the model stops at one step on
 *   every replica and trains on from there. If they cannot finish in time
 *   (a core hangs), or a second tpu_cancel comes first, the call says so:
 *   re-initialize the system and restore the model (as after a lost core).
 * A cancel while no call is in progress is forgotten when the next call
 * begins.
 * Thread-safe and async-signal-safe (a signal handler may call it): it sets
 * no last error, and returns TPU_INVALID_ARGUMENT for NULL or a pointer that
 * is not a live cluster handle, TPU_OK otherwise. c must stay allocated until
 * tpu_cancel returns. */
TPU_API tpu_status tpu_cancel(tpu_cluster *c);

/* "HOST:PORT" of the endpoint this cluster handle talks to. Owned by c. */
TPU_API const char *tpu_cluster_endpoint(const tpu_cluster *c);
/* "PID@HOSTNAME": how the resolver names this client. Owned by c. */
TPU_API const char *tpu_cluster_client_id(const tpu_cluster *c);
/* Epoch this handle initialized (0 if it never did). */
TPU_API uint64_t tpu_cluster_epoch(const tpu_cluster *c);
/* The system epoch in the resolver's latest answer to this handle (cluster
 * spec, initialize, system check or shutdown: after a shutdown, the new epoch). */
TPU_API uint64_t tpu_cluster_system_epoch(const tpu_cluster *c);

typedef enum tpu_core_state {
    TPU_CORE_UNKNOWN = 0,
    TPU_CORE_IDLE = 1,  /* alive, not part of the initialized system */
    TPU_CORE_READY = 2, /* alive and part of the initialized system */
    TPU_CORE_DEAD = 3,  /* missed too many heartbeats */
    TPU_CORE_PREEMPTED = 4,   /* terminated by a preemption (until its worker registers again) */
    TPU_CORE_MAINTENANCE = 5, /* down for a maintenance event; back, restarted, when it ends */
} tpu_core_state;
#define TPU_CORE_STATES 6 /* values of tpu_core_state */
TPU_API const char *tpu_core_state_name(tpu_core_state s); /* "READY" */

/* A notice of what is coming to a core, as Cloud TPU gives one (tpuctl chaos
 * preempt, maintenance). A training loop learns of it from the answers of the
 * steps it runs (tpu_model_notice), without asking the resolver; fit stops
 * at a step boundary and saves a checkpoint (tpu_fit_options.preemption). */
typedef enum tpu_notice_kind {
    TPU_NOTICE_NONE = 0,
    TPU_NOTICE_PREEMPTION = 1,  /* the core is terminated at the event */
    TPU_NOTICE_MAINTENANCE = 2, /* the core is down for window_ms from the event, then back, restarted */
} tpu_notice_kind;
typedef struct tpu_notice {
    tpu_notice_kind kind;
    uint64_t event_in_ms; /* until the event, as of when the notice was read; under way: until its end */
    uint32_t window_ms;   /* maintenance: how long the core is down */
    int under_way;        /* maintenance: the window has begun */
    uint64_t reserved[8]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_notice;
/* "PREEMPTION", "MAINTENANCE", "NONE" */
TPU_API const char *tpu_notice_kind_name(tpu_notice_kind k);

/* One core as the resolver sees it. Strings are owned by the spec. */
typedef struct tpu_core_info {
    const char *host_id;
    int core;                 /* index on its host */
    const char *control_addr; /* tcp://ADDR:PORT */
    const char *data_addr;    /* ADDR:PORT */
    const char *tpu_type;     /* "v3" */
    uint64_t hbm_capacity;    /* bytes */
    uint64_t hbm_used;        /* bytes */
    tpu_core_state state;
    uint64_t heartbeat_age_ms;
    int replica_id;           /* -1 unless READY */
    uint32_t pid;
    const char *version;
    uint64_t hbm_peak;        /* bytes: the most in use since the last initialize */
    tpu_notice notice;        /* what is coming to it (kind NONE: nothing) */
    uint32_t hbm_ooms;        /* compiles refused for want of HBM since the last initialize */
    uint64_t reserved[8];     /* zero: room to grow (docs/api/conventions.md) */
} tpu_core_info;

typedef struct tpu_cluster_spec tpu_cluster_spec;

/* A fresh snapshot of every core the resolver knows, sorted by host then core. */
TPU_API tpu_status tpu_cluster_spec_get(tpu_cluster *c, tpu_cluster_spec **out);
TPU_API void tpu_cluster_spec_free(tpu_cluster_spec *s);
TPU_API size_t tpu_cluster_spec_num_cores(const tpu_cluster_spec *s);
/* Fills *out for core i (0-based, < num_cores); TPU_OUT_OF_RANGE otherwise. */
TPU_API tpu_status tpu_cluster_spec_core(const tpu_cluster_spec *s, size_t i, tpu_core_info *out);
TPU_API uint64_t tpu_cluster_spec_epoch(const tpu_cluster_spec *s);
TPU_API int tpu_cluster_spec_initialized(const tpu_cluster_spec *s);
TPU_API uint32_t tpu_cluster_spec_heartbeat_ms(const tpu_cluster_spec *s);
TPU_API uint32_t tpu_cluster_spec_dead_after(const tpu_cluster_spec *s);
/* Client id that initialized the current system ("" if none/unknown). Owned by s. */
TPU_API const char *tpu_cluster_spec_owner(const tpu_cluster_spec *s);
/* Software version of the resolver. Owned by s. */
TPU_API const char *tpu_cluster_spec_resolver_version(const tpu_cluster_spec *s);

/* Health, with Cloud TPU's names (the Node's health and its symptoms). */
typedef enum tpu_health {
    TPU_HEALTH_UNSPECIFIED = 0,    /* no cores, or none of them answers for itself (preempted) */
    TPU_HEALTH_HEALTHY = 1,
    TPU_HEALTH_TIMEOUT = 2,        /* it stopped answering: missed heartbeats */
    TPU_HEALTH_UNHEALTHY_TENSORFLOW = 3,  /* the program cannot run on it: restarted out of the initialized system */
    TPU_HEALTH_UNHEALTHY_MAINTENANCE = 4, /* down for a maintenance event */
    /* deprecated names, kept until the next SOVERSION */
    TPU_HEALTHY = TPU_HEALTH_HEALTHY,
    TPU_UNHEALTHY_TENSORFLOW = TPU_HEALTH_UNHEALTHY_TENSORFLOW,
    TPU_UNHEALTHY_MAINTENANCE = TPU_HEALTH_UNHEALTHY_MAINTENANCE,
} tpu_health;
typedef enum tpu_symptom {
    TPU_SYMPTOM_NONE = 0,
    TPU_SYMPTOM_LOW_MEMORY = 1,        /* 90 % or more of its HBM in use */
    TPU_SYMPTOM_OUT_OF_MEMORY = 2,     /* (not emulated: the host's memory) */
    TPU_SYMPTOM_EXECUTE_TIMED_OUT = 3, /* (not emulated) */
    TPU_SYMPTOM_MESH_BUILD_FAIL = 4,   /* (not emulated) */
    TPU_SYMPTOM_HBM_OUT_OF_MEMORY = 5, /* a compile was refused for want of HBM since the last initialize */
} tpu_symptom;
typedef struct tpu_core_health {
    tpu_health health;
    tpu_symptom symptom; /* the most telling one; NONE when there is none */
    char details[192];   /* what happened, in words ("" when healthy with nothing to tell) */
    uint64_t reserved[8]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_core_health;
/* "HEALTHY", "TIMEOUT", "UNHEALTHY_TENSORFLOW", "UNHEALTHY_MAINTENANCE", "HEALTH_UNSPECIFIED" */
TPU_API const char *tpu_health_name(tpu_health h);
/* "LOW_MEMORY", "HBM_OUT_OF_MEMORY", ...; "" for NONE */
TPU_API const char *tpu_symptom_name(tpu_symptom s);
/* Core i's health: DEAD is TIMEOUT, MAINTENANCE is UNHEALTHY_MAINTENANCE, an
 * IDLE core while a system is initialized (restarted) UNHEALTHY_TENSORFLOW,
 * PREEMPTED HEALTH_UNSPECIFIED; a pending notice is told in details. */
TPU_API tpu_status tpu_cluster_spec_core_health(const tpu_cluster_spec *s, size_t i, tpu_core_health *out);
/* The cluster's (the Node's): HEALTHY when every core is; TIMEOUT when every
 * core is silent; UNHEALTHY_MAINTENANCE when one is down for maintenance,
 * else UNHEALTHY_TENSORFLOW when one is not healthy; HEALTH_UNSPECIFIED
 * without cores. */
TPU_API tpu_health tpu_cluster_spec_health(const tpu_cluster_spec *s);

/* TensorFlow's ClusterSpec of the cluster (TPUClusterResolver.cluster_spec()):
 * job "worker" with one task per host, "HOST:PORT": for a comma list in
 * TPU_NAME the list as given, else every host the spec lists, at its lowest
 * core's control address, in host order. Strings owned by s. */
TPU_API const char *tpu_cluster_spec_job_name(const tpu_cluster_spec *s); /* "worker" */
TPU_API size_t tpu_cluster_spec_num_tasks(const tpu_cluster_spec *s);
/* Task i's address, or NULL past the end. */
TPU_API const char *tpu_cluster_spec_task_address(const tpu_cluster_spec *s, size_t i);
/* The resolver's TPU node name (tpu-resolver --name), "" if none. Owned by s. */
TPU_API const char *tpu_cluster_spec_tpu_name(const tpu_cluster_spec *s);

/* num_accelerators(), TensorFlow's {'TPU': N}: the live (IDLE or READY) cores
 * per host, which must be the same on every host (0 without live cores).
 * Errors: TPU_FAILED_PRECONDITION when hosts differ, as TensorFlow's
 * RuntimeError: "TPU cores on each device is not the same. This should never
 * happen. Devices: {'host0': ['0', '1'], 'host1': ['0']}". */
TPU_API tpu_status tpu_num_accelerators(tpu_cluster *c, int *out);

/* TPUSystemMetadata, counted over live cores. */
typedef struct tpu_system_metadata {
    int num_cores;
    int num_hosts;
    int num_of_cores_per_host; /* the largest host's count */
    char tpu_type[16];
    uint64_t reserved[8]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_system_metadata;
TPU_API tpu_status tpu_system_metadata_get(tpu_cluster *c, tpu_system_metadata *out);

/* ---- the TPU system ---- */

typedef struct tpu_init_options {
    uint32_t expect;      /* cores to wait for; 0: the cores alive now (dead ones listed as missing) */
    uint32_t timeout_ms;  /* how long to wait for them; 0: 10000 */
    int allow_partial;    /* at the deadline, go on without the missing cores */
    int keep_scheduled_faults; /* the cores keep the faults waiting for a step (tpu_fault.at_step);
                                  0: a new system cancels those whose core has trained since they
                                  were scheduled (their run is over) */
    uint64_t reserved[8];      /* zero: room to grow (docs/api/conventions.md) */
} tpu_init_options;

typedef struct tpu_topology tpu_topology;

/* initialize_tpu_system: waits (up to the deadline) for the expected cores,
 * starts a new epoch, resets every core (HBM emptied, compiled state dropped),
 * assigns replica ids in ring order with each host's cores adjacent, and
 * returns the Topology. opts may be NULL. The cluster handle then belongs to
 * the new epoch; another client initializing later takes the system over and
 * this handle's next epoch-bound call fails with TPU_FAILED_PRECONDITION.
 * On a handle that holds a system already (initialized or attached) it first
 * warns, as TensorFlow does, through the warning handler (tpuemu/model.h):
 * "TPU system ADDR has already been initialized. Reinitializing the TPU can
 * cause previously created variables on TPU to be lost."; a model trained on
 * the old system must then load a checkpoint or be compiled again.
 * Errors: TPU_NOT_FOUND when fewer than the expected cores are alive at the
 * deadline ("TPUs not found in the cluster. Failed in initialization: 2 of 3
 * expected cores alive after 10.0 s; missing: ...", TensorFlow's words): worth
 * waiting for, the cores may be starting; TPU_UNAVAILABLE when a chosen core
 * fails the reset or the resolver cannot be reached; TPU_ABORTED while
 * another initialize runs; TPU_INVALID_ARGUMENT. */
TPU_API tpu_status tpu_initialize_system(tpu_cluster *c, const tpu_init_options *opts,
                                         tpu_topology **out);
TPU_API void tpu_topology_free(tpu_topology *t);

TPU_API uint64_t tpu_topology_epoch(const tpu_topology *t);
/* mesh_shape: x, y, z, cores per chip. Writes up to 4 values, returns the count. */
TPU_API size_t tpu_topology_mesh_shape(const tpu_topology *t, int out[4]);
TPU_API int tpu_topology_num_replicas(const tpu_topology *t);
TPU_API int tpu_topology_num_tasks(const tpu_topology *t);
TPU_API int tpu_topology_num_tpus_per_task(const tpu_topology *t);
TPU_API const char *tpu_topology_tpu_type(const tpu_topology *t);
/* Client id that initialized this system. Owned by t. */
TPU_API const char *tpu_topology_owner(const tpu_topology *t);

typedef struct tpu_topology_core {
    int replica_id;  /* also the position in the ring */
    const char *host_id;
    int core;
    int task_id;
    int coords[4];   /* x, y, z, core on chip */
    const char *data_addr;
    uint64_t reserved[8]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_topology_core;
/* Core by replica id (0 .. num_replicas-1). Strings owned by t. */
TPU_API tpu_status tpu_topology_core_get(const tpu_topology *t, int replica, tpu_topology_core *out);
/* nanomsg URL of that core's control socket, or NULL. Owned by t. */
TPU_API const char *tpu_topology_control_addr(const tpu_topology *t, int replica);
/* Missing devices ("host1/3 (dead: no heartbeat for 4.1 s)"), with allow_partial. */
TPU_API size_t tpu_topology_num_missing(const tpu_topology *t);
TPU_API const char *tpu_topology_missing(const tpu_topology *t, size_t i);

/* TensorFlow's Topology (tf.tpu.experimental.Topology, tensorflow/python/tpu/
 * topology.py). A device is task T's TPU device D: T is the host's index
 * (task_id), D the core's place among its host's cores in ring order. Its
 * coordinates are its physical place in the slice, [x, y, z, core on chip]:
 * each host owns a contiguous block of chips (a v3 host's 4 chips are 2x2 in
 * x, y), blocks tile the mesh x first, then y, then z.
 *
 * device_coordinates: *coords points to num_tasks * num_tpus_per_task * 4
 * ints, entry [task][device][axis] (owned by t); shape (may be NULL) gets
 * {num_tasks, num_tpus_per_task, 4}. TPU_FAILED_PRECONDITION when the hosts
 * have different numbers of cores (a partial system): TensorFlow's array is
 * rectangular. */
TPU_API tpu_status tpu_topology_device_coordinates(const tpu_topology *t, const int **coords,
                                                   int shape[3]);
/* task_ordinal_at_coordinates / tpu_device_ordinal_at_coordinates: the task
 * (device) at coords, or -1 where the mesh has no device (as TensorFlow).
 * TPU_OUT_OF_RANGE for coordinates outside the mesh. */
TPU_API tpu_status tpu_topology_task_ordinal_at_coordinates(const tpu_topology *t,
                                                            const int coords[4], int *task);
TPU_API tpu_status tpu_topology_tpu_device_ordinal_at_coordinates(const tpu_topology *t,
                                                                  const int coords[4], int *device);
/* tpu_device_name_at_coordinates: "/job:worker/task:1/device:TPU:3"
 * (job NULL: "/task:1/device:TPU:3"); cpu_device_name_at_coordinates: the
 * host's "/job:worker/task:1/device:CPU:0". Written into buf (n bytes).
 * TPU_NOT_FOUND where the mesh has no device, TPU_OUT_OF_RANGE outside the
 * mesh, TPU_INVALID_ARGUMENT when buf is too small. */
TPU_API tpu_status tpu_topology_tpu_device_name_at_coordinates(const tpu_topology *t,
                                                               const int coords[4], const char *job,
                                                               char *buf, size_t n);
TPU_API tpu_status tpu_topology_cpu_device_name_at_coordinates(const tpu_topology *t,
                                                               const int coords[4], const char *job,
                                                               char *buf, size_t n);
/* missing_devices: the places of the mesh no device holds (TensorFlow's
 * np.argwhere(tasks < 0): x slowest, core on chip fastest). */
TPU_API size_t tpu_topology_num_missing_devices(const tpu_topology *t);
TPU_API tpu_status tpu_topology_missing_device(const tpu_topology *t, size_t i, int coords[4]);
/* serialized(): TensorFlow's TopologyProto bytes (tensorflow/core/protobuf/
 * tpu/topology.proto: mesh_shape, num_tasks, num_tpu_devices_per_task,
 * device_coordinates), byte for byte what Topology.serialized() returns.
 * *bytes owned by t. TPU_FAILED_PRECONDITION as device_coordinates. */
TPU_API tpu_status tpu_topology_serialized(const tpu_topology *t, const uint8_t **bytes,
                                           size_t *len);
/* Topology(serialized=...): a topology parsed from TopologyProto bytes (from
 * tpu_topology_serialized or from TensorFlow). TPU_INVALID_ARGUMENT with
 * TensorFlow's message for a malformed one ("`mesh_shape` must be a vector of
 * size 4 with positive entries; got [2, 2]"). It has no epoch, owner, TPU
 * type or addresses (0 and ""); its replica r is task r / num_tpus_per_task's
 * device r % num_tpus_per_task. Free with tpu_topology_free. */
TPU_API tpu_status tpu_topology_from_serialized(const void *bytes, size_t len, tpu_topology **out);

/* Is the system this handle initialized still the current one?
 * TPU_OK, or TPU_FAILED_PRECONDITION saying who re-initialized or shut it down. */
TPU_API tpu_status tpu_system_check(tpu_cluster *c);

/* shutdown_tpu_system: every core leaves the system and is reset; a new epoch
 * starts with nothing initialized. On a handle that initialized the system it
 * first checks that the system is still its own (TPU_FAILED_PRECONDITION
 * otherwise); on any other handle it shuts down whatever is current. */
TPU_API tpu_status tpu_shutdown_system(tpu_cluster *c);

/* Makes the resolver forget a dead core now (`tpuctl forget HOST/CORE`): it is
 * no longer listed, and an initialize without an expected count no longer
 * waits for it. (A worker stopped with SIGTERM leaves by itself, and the
 * resolver forgets a core dead for longer than its --forget-after-ms.) If
 * silent_ms is not NULL it gets how long ago the core last heartbeated.
 * Blocks up to the resolver handle's timeout. Errors: TPU_NOT_FOUND (no such
 * core), TPU_FAILED_PRECONDITION (the core is alive: stop its worker instead),
 * TPU_INVALID_ARGUMENT, TPU_UNAVAILABLE. */
TPU_API tpu_status tpu_forget_core(tpu_cluster *c, const char *host_id, int core, uint64_t *silent_ms);

/* ---- fault injection (`tpuctl chaos`) ---- */

typedef enum tpu_fault_kind {
    TPU_FAULT_KILL = 1,  /* the worker dies at once (SIGKILL): a crashed host */
    TPU_FAULT_PAUSE = 2, /* every thread of the worker stops for duration_ms: a hung host */
    TPU_FAULT_SLOW = 3,  /* its training compute runs at percent % of its speed for duration_ms
                            (0: until the next TPU_FAULT_SLOW; percent 100 ends a slow-down) */
    TPU_FAULT_HBM = 4,   /* percent % of its HBM is taken for duration_ms (0: until the next
                            initialize): a compile that no longer fits fails with the OOM error,
                            which lists the pressure by name */
    TPU_FAULT_PREEMPT = 5,     /* a preemption notice now; notice_ms later the worker terminates
                                  (exit status 4) and the core is listed PREEMPTED */
    TPU_FAULT_MAINTENANCE = 6, /* a maintenance notice now; notice_ms later the core leaves its
                                  system and is down (MAINTENANCE) for duration_ms, then back,
                                  restarted (IDLE) */
    TPU_FAULT_SKEW = 7,        /* its wall clock (message dates, the replay window) is skew_ms off for
                                  duration_ms (0: until the next skew; skew_ms 0 ends it): with a
                                  cluster token, beyond 60 s its messages are refused as replays */
    /* Link faults: the data-plane chunks the core sends to the peer core
     * (peer_host/peer_core) for duration_ms, in order; tpu_inject_link_fault
     * faults both directions. */
    TPU_FAULT_LINK_DELAY = 8,  /* each chunk is held latency_ms before it is sent */
    TPU_FAULT_LINK_LOSS = 9,   /* each transmission of a chunk is lost with probability percent %
                                  and made again after a timeout (200 ms, doubling while it is
                                  lost again, up to 3.2 s), as over TCP: a delay, never a wrong
                                  byte; seed picks the losses (the same seed, the same losses) */
    TPU_FAULT_PARTITION = 10,  /* no chunk passes: a collective that waits on the link longer than
                                  the silence timeout (heartbeat x dead-after / 2) fails naming both
                                  cores; after duration_ms the link works again */
} tpu_fault_kind;

typedef struct tpu_fault {
    tpu_fault_kind kind;
    uint32_t duration_ms; /* PAUSE, MAINTENANCE, link faults: 1..600000; SLOW, HBM: 0..600000;
                             KILL, PREEMPT: 0 */
    uint32_t percent;     /* SLOW, HBM, LINK_LOSS: 1..100; otherwise 0 */
    /* When (at most one of the two; both 0: at once): delay_ms (up to an hour)
     * after the worker accepts it, or once that core has finished training
     * step at_step (1-based, as tpu_model_step counts). At most 16 faults wait
     * on a core at once. */
    uint32_t delay_ms;
    uint64_t at_step;
    uint32_t notice_ms;   /* PREEMPT, MAINTENANCE: from the notice to the event, 0..600000; otherwise 0 */
    int32_t skew_ms;      /* SKEW: -3600000..3600000; otherwise 0 */
    uint32_t latency_ms;  /* LINK_DELAY: 1..60000; otherwise 0 */
    const char *peer_host; /* link faults: the core at the other end (tpu_inject_fault); otherwise NULL */
    int peer_core;
    uint32_t seed;        /* LINK_LOSS: which transmissions are lost; otherwise 0 */
    uint64_t reserved[8]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_fault;

/* "kill", "pause", "slow", "hbm", "preempt", "maintenance", "skew", "link-delay", "link-loss",
 * "partition"; NULL for a value that is not a kind. */
TPU_API const char *tpu_fault_kind_name(tpu_fault_kind k);
/* The kind named name; TPU_INVALID_ARGUMENT naming the kinds otherwise. */
TPU_API tpu_status tpu_fault_kind_parse(const char *name, tpu_fault_kind *out);
/* Injects f into core host_id/core, straight to its worker's control port
 * (with the cluster token when the cluster has one: only a holder of the
 * token can inject). The worker checks the whole fault first and refuses it
 * (nothing injected) when a field is out of range; once it has answered,
 * the fault takes effect (a kill or pause 50 ms later), is logged by that
 * worker and counted in its /metrics (tpuemu_worker_faults_injected_total).
 * Blocks up to the resolver handle's timeout. Errors: TPU_NOT_FOUND (no such
 * core, or for a link fault no such peer core), TPU_INVALID_ARGUMENT (a bad
 * fault, or a link from the core to itself), TPU_FAILED_PRECONDITION (a kill
 * or pause already under way there), TPU_UNAVAILABLE (its worker did not
 * answer), TPU_UNAUTHENTICATED. A link fault given this way concerns one
 * direction: what host_id/core sends to the peer. */
TPU_API tpu_status tpu_inject_fault(tpu_cluster *c, const char *host_id, int core, const tpu_fault *f);
/* Injects the link fault f (LINK_DELAY, LINK_LOSS, PARTITION; its peer_host
 * and peer_core are ignored) on the link between cores a and b, both ways:
 * into a for what it sends to b, then into b for what it sends to a. Both
 * cores are looked up in the cluster and the fault is checked before either
 * gets it; should b still refuse it (or not answer), a has it and the error
 * says so. Errors as tpu_inject_fault. */
TPU_API tpu_status tpu_inject_link_fault(tpu_cluster *c, const char *a_host, int a_core, const char *b_host,
                                         int b_core, const tpu_fault *f);
/* A fault waiting on a core for its delay or its step (tpu_list_faults). */
typedef struct tpu_scheduled_fault {
    uint32_t id;          /* the core's number for it (tpu_cancel_faults); never reused by that process */
    tpu_fault_kind kind;
    uint64_t at_step;     /* the step it waits for; 0: it waits for its time */
    uint32_t due_in_ms;   /* by time: how long until it fires */
    uint32_t duration_ms, percent, notice_ms;
    char peer_host[256];  /* link faults: the other end; otherwise "" */
    int peer_core;
    uint64_t reserved[8]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_scheduled_fault;
/* Lists the faults waiting on core host_id/core (at most 16): the first max
 * into out, each elem_size bytes apart (give sizeof(tpu_scheduled_fault):
 * a later library with a longer struct writes only the fields this one
 * knows), and how many wait into *n. A fault waiting for a step is cancelled
 * by the first tpu_initialize_system after its core trained a step (unless
 * its options keep them); faults waiting for their time outlive it. Blocks up to the resolver handle's
 * timeout. Errors as tpu_inject_fault. */
TPU_API tpu_status tpu_list_faults(tpu_cluster *c, const char *host_id, int core, tpu_scheduled_fault *out,
                                   size_t max, size_t elem_size, size_t *n);
/* Cancels the fault numbered id waiting on core host_id/core (id 0: every
 * fault waiting there); *cancelled (if not NULL) says how many were.
 * Errors: TPU_NOT_FOUND (no such core, or no fault waits under id), as
 * tpu_inject_fault otherwise. */
TPU_API tpu_status tpu_cancel_faults(tpu_cluster *c, const char *host_id, int core, uint32_t id,
                                     size_t *cancelled);
/* Injects f into the resolver itself (tpuctl chaos kill|pause resolver): a
 * kill (it dies at once, SIGKILL: restart it, and the workers register again
 * by their next heartbeats) or a pause of 1..600000 ms (every thread stops,
 * as a hung resolver), at once (no delay, step, percent or notice), 50 ms
 * after it answers. Errors: TPU_INVALID_ARGUMENT (another kind or field),
 * TPU_FAILED_PRECONDITION (a pause under way), TPU_UNAVAILABLE,
 * TPU_UNAUTHENTICATED. */
TPU_API tpu_status tpu_inject_resolver_fault(tpu_cluster *c, const tpu_fault *f);

/* ---- collectives: all-reduce, broadcast, all-gather, reduce-scatter ----
 *
 * Buffers are held by the caller, one per replica (bufs[r] for replica r, in
 * replica order of the initialized system). A call sends every replica's input
 * to its core over a data-plane connection, the cores run the collective among
 * themselves, and each core's output is read straight back into that replica's
 * buffer. The first call opens one authenticated connection per core (kept for
 * later calls, closed by tpu_cluster_free or a re-initialize); every socket is
 * driven at once, so inputs, results and slow cores never block one another.
 *
 * Requires the system this handle initialized (tpu_initialize_system) or
 * adopted (tpu_attach_system). Blocks until every core answered, with a
 * deadline derived from the size (at least 30 s; it only matters when a core
 * neither answers nor fails: a core that dies or hangs makes the others fail
 * within heartbeat_ms x dead_after, and once one replica failed the call waits
 * at most 2 x that + 1 s more for the remaining answers).
 * Errors: TPU_INVALID_ARGUMENT (shape, dtype, group assignment),
 * TPU_FAILED_PRECONDITION (no system, or it was re-initialized by someone
 * else, or an earlier collective failed and the system must be re-initialized),
 * TPU_UNAVAILABLE naming the core, its host and the collective ("core h1/3 never
 * sent chunk 5 of all-reduce #812"), TPU_RESOURCE_EXHAUSTED (too large for the
 * cores' memory), TPU_DEADLINE_EXCEEDED. On any error the output buffers'
 * contents are unspecified. tpu_last_collective() tells more, per replica. */

typedef enum tpu_dtype {
    TPU_DTYPE_F32 = 0,
    TPU_DTYPE_BF16 = 1, /* bfloat16 (uint16_t storage), reduced in float32, rounded once */
    /* deprecated names, kept until the next SOVERSION */
    TPU_F32 = TPU_DTYPE_F32,
    TPU_BF16 = TPU_DTYPE_BF16,
} tpu_dtype;

typedef enum tpu_reduce_op {
    TPU_REDUCE_SUM = 0,
    TPU_REDUCE_MEAN = 1, /* SUM, then one multiplication by 1/n at the end */
    TPU_REDUCE_MAX = 2,  /* NaN propagates */
    TPU_REDUCE_MIN = 3,
    /* deprecated names, kept until the next SOVERSION */
    TPU_SUM = TPU_REDUCE_SUM,
    TPU_MEAN = TPU_REDUCE_MEAN,
    TPU_MAX = TPU_REDUCE_MAX,
    TPU_MIN = TPU_REDUCE_MIN,
} tpu_reduce_op;

typedef enum tpu_algo {
    TPU_ALGO_AUTO = 0, /* chosen by size and topology */
    TPU_ALGO_RING = 1, /* pipelined ring: bandwidth-optimal */
    TPU_ALGO_HD = 2,   /* recursive halving-doubling: latency-optimal */
    TPU_ALGO_HIER = 3, /* inside each host, then across hosts */
} tpu_algo;

typedef struct tpu_collective_options {
    tpu_algo algo;
    int reproducible;             /* sums bitwise independent of algorithm, chunking, core count */
    const int *group_assignment;  /* num_replicas entries: replica -> group index (0..n-1), every
                                     group the same size; NULL: one group of all replicas */
    size_t chunk_bytes;           /* pipeline chunk; 0: chosen by the core */
    uint32_t iters;               /* run back to back this many times (benchmarks); 0 = 1 */
    uint64_t reserved[8];         /* zero: room to grow (docs/api/conventions.md) */
} tpu_collective_options;

/* Element size in bytes of a dtype (4 or 2; 0 if unknown). */
TPU_API size_t tpu_dtype_size(tpu_dtype d);
TPU_API const char *tpu_dtype_name(tpu_dtype d);         /* "f32", "bf16" */
TPU_API const char *tpu_reduce_op_name(tpu_reduce_op o); /* "sum", ... */
TPU_API const char *tpu_algo_name(tpu_algo a);           /* "auto", "ring", "hd", "hier" */

/* Adopts the system someone else initialized (e.g. `tpuctl init`): the
 * current epoch and its cores, from the resolver's cluster spec, without
 * resetting anything. Errors: TPU_FAILED_PRECONDITION if no system is
 * initialized. Collectives then use a sequence range of their own. */
TPU_API tpu_status tpu_attach_system(tpu_cluster *c);

/* Number of replicas of the system this handle initialized or adopted (0: none). */
TPU_API int tpu_cluster_num_replicas(const tpu_cluster *c);

/* All-reduce in place: bufs[r] holds count elements of replica r and gets the
 * reduction over its group. opts may be NULL (auto, one group). */
TPU_API tpu_status tpu_all_reduce(tpu_cluster *c, void *const *bufs, size_t count, tpu_dtype dtype,
                                  tpu_reduce_op op, const tpu_collective_options *opts);

/* Broadcast in place from replica root: every bufs[r] gets root's count
 * elements (only root's buffer is read). */
TPU_API tpu_status tpu_broadcast(tpu_cluster *c, void *const *bufs, size_t count, tpu_dtype dtype,
                                 int root, const tpu_collective_options *opts);

/* All-gather: in[r] holds count elements; out[r] (room for g x count, g the
 * group size) gets the inputs of its group's replicas, in replica order. */
TPU_API tpu_status tpu_all_gather(tpu_cluster *c, const void *const *in, void *const *out, size_t count,
                                  tpu_dtype dtype, const tpu_collective_options *opts);

/* Reduce-scatter: in[r] holds count elements; the reduction is split in g
 * blocks, block b = elements [b*count/g, (b+1)*count/g) (integer division), and
 * out[r] gets block k where k is r's position in its group. See
 * tpu_reduce_scatter_block() for the sizes. */
TPU_API tpu_status tpu_reduce_scatter(tpu_cluster *c, const void *const *in, void *const *out, size_t count,
                                      tpu_dtype dtype, tpu_reduce_op op, const tpu_collective_options *opts);
/* First element and element count of block k of g for count elements. */
TPU_API void tpu_reduce_scatter_block(size_t count, int g, int k, size_t *first, size_t *n);

/* What the last collective call on this handle did (also after a failure). */
typedef struct tpu_collective_stats {
    uint64_t seq;            /* its sequence number ("#seq" in messages) */
    int num_replicas;
    uint32_t iters;
    uint64_t time_ns;        /* per iteration, as the slowest core measured it */
    uint64_t wall_ns;        /* the whole call as the client saw it */
    char algorithm[32];      /* as the cores reported it: "ring", "hd", "hier" */
    char transport[8];       /* "tcp", "shm" (any core reported "+shm"), "" if unknown */
    int num_failed;          /* replicas whose core reported or caused an error */
    uint64_t time_p50_ns;    /* the largest of the cores' median times per iteration, as the
                                OpenMPI and Gloo benchmarks report theirs (0: one iteration) */
    uint64_t reserved[8];    /* zero: room to grow (docs/api/conventions.md) */
} tpu_collective_stats;
TPU_API tpu_status tpu_last_collective(const tpu_cluster *c, tpu_collective_stats *out);

/* Per replica outcome of the last collective: its status and message (owned by
 * c, valid until the next collective call), and when the answer (or the
 * failure) arrived, in CLOCK_MONOTONIC milliseconds. TPU_OUT_OF_RANGE for a
 * bad replica. */
typedef struct tpu_replica_result {
    tpu_status status;
    const char *message;       /* "" when OK */
    uint64_t answered_mono_ms; /* 0: never answered */
    uint64_t time_ns;          /* that core's time per iteration */
    const char *algorithm;     /* that core's algo_used; owned by c */
    uint64_t time_p50_ns;      /* the median of that core's iterations' times (0: one iteration) */
    uint64_t reserved[8];      /* zero: room to grow (docs/api/conventions.md) */
} tpu_replica_result;
TPU_API tpu_status tpu_last_collective_replica(const tpu_cluster *c, int replica, tpu_replica_result *out);

#ifdef __cplusplus
}
#endif

#endif
