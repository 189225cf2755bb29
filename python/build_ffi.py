"""Writes the C source of tpuemu's extension module (cffi, out-of-line API mode).

    build_ffi.py INCLUDE_DIR... OUT.c

The functions are taken from the public headers as they are (every TPU_API
declaration, through the C preprocessor), so the module always has the
library's whole API. The types the Python layer reads are declared here by
hand with only the fields it uses, followed by "...;": their layout comes from
the real header when the module is compiled, and a field or an enum constant
the Python layer needs that the header no longer has fails the build. Types
it does not read are declared without fields (enums as int), so a new type in
a header needs nothing here.
"""
import os
import re
import subprocess
import sys

import cffi

HEADERS = ["tpuemu/tpuemu.h", "tpuemu/data.h", "tpuemu/model.h", "tpuemu/profile.h"]

TYPES = r"""
typedef enum tpu_status {
    TPU_OK, TPU_CANCELLED, TPU_UNKNOWN, TPU_INVALID_ARGUMENT, TPU_DEADLINE_EXCEEDED,
    TPU_NOT_FOUND, TPU_ALREADY_EXISTS, TPU_PERMISSION_DENIED, TPU_RESOURCE_EXHAUSTED,
    TPU_FAILED_PRECONDITION, TPU_ABORTED, TPU_OUT_OF_RANGE, TPU_UNIMPLEMENTED, TPU_INTERNAL,
    TPU_UNAVAILABLE, TPU_DATA_LOSS, TPU_UNAUTHENTICATED, TPU_PREEMPTED, ...
} tpu_status;

typedef struct tpu_resolver tpu_resolver;
typedef struct tpu_cluster tpu_cluster;
typedef struct tpu_cluster_spec tpu_cluster_spec;
typedef struct tpu_topology tpu_topology;
typedef struct tpu_dataset tpu_dataset;
typedef struct tpu_dataset_iter tpu_dataset_iter;
typedef struct tpu_file_dataset tpu_file_dataset;
typedef struct tpu_strategy tpu_strategy;
typedef struct tpu_model tpu_model;
typedef struct tpu_history tpu_history;
typedef struct tpu_dist_dataset tpu_dist_dataset;
typedef struct tpu_dist_iter tpu_dist_iter;
typedef struct tpu_per_replica tpu_per_replica;
typedef struct tpu_profile tpu_profile;

typedef enum tpu_core_state { TPU_CORE_UNKNOWN, TPU_CORE_IDLE, TPU_CORE_READY, TPU_CORE_DEAD,
    TPU_CORE_PREEMPTED, TPU_CORE_MAINTENANCE, ... } tpu_core_state;
typedef enum tpu_notice_kind { TPU_NOTICE_NONE, TPU_NOTICE_PREEMPTION, TPU_NOTICE_MAINTENANCE, ... }
    tpu_notice_kind;
typedef struct tpu_notice {
    tpu_notice_kind kind;
    uint64_t event_in_ms;
    uint32_t window_ms;
    int under_way;
    ...;
} tpu_notice;
typedef struct tpu_core_info {
    const char *host_id;
    int core;
    const char *control_addr;
    const char *data_addr;
    const char *tpu_type;
    uint64_t hbm_capacity;
    uint64_t hbm_used;
    tpu_core_state state;
    uint64_t heartbeat_age_ms;
    int replica_id;
    uint32_t pid;
    const char *version;
    uint64_t hbm_peak;
    tpu_notice notice;
    uint32_t hbm_ooms;
    ...;
} tpu_core_info;
typedef enum tpu_health { TPU_HEALTH_UNSPECIFIED, TPU_HEALTHY, TPU_HEALTH_TIMEOUT,
    TPU_UNHEALTHY_TENSORFLOW, TPU_UNHEALTHY_MAINTENANCE, ... } tpu_health;
typedef enum tpu_symptom { TPU_SYMPTOM_NONE, ... } tpu_symptom;
typedef enum tpu_map_kind { TPU_MAP_SCALE, TPU_MAP_SHIFT, TPU_MAP_NORMALIZE, ... } tpu_map_kind;
typedef enum tpu_input_placement { TPU_INPUT_ON_HOSTS, TPU_INPUT_ON_CLIENT, ... } tpu_input_placement;
typedef struct tpu_core_health {
    tpu_health health;
    tpu_symptom symptom;
    char details[];
    ...;
} tpu_core_health;
typedef struct tpu_system_metadata {
    int num_cores;
    int num_hosts;
    int num_of_cores_per_host;
    char tpu_type[];
    ...;
} tpu_system_metadata;
typedef struct tpu_init_options {
    uint32_t expect;
    uint32_t timeout_ms;
    int allow_partial;
    int keep_scheduled_faults;
    ...;
} tpu_init_options;
typedef struct tpu_topology_core {
    int replica_id;
    const char *host_id;
    int core;
    int task_id;
    int coords[4];
    const char *data_addr;
    ...;
} tpu_topology_core;

typedef enum tpu_fault_kind { TPU_FAULT_KILL, TPU_FAULT_PAUSE, TPU_FAULT_SLOW, TPU_FAULT_HBM,
    TPU_FAULT_PREEMPT, TPU_FAULT_MAINTENANCE, TPU_FAULT_SKEW, TPU_FAULT_LINK_DELAY,
    TPU_FAULT_LINK_LOSS, TPU_FAULT_PARTITION, ... } tpu_fault_kind;
typedef struct tpu_fault {
    tpu_fault_kind kind;
    uint32_t duration_ms;
    uint32_t percent;
    uint32_t delay_ms;
    uint64_t at_step;
    uint32_t notice_ms;
    int32_t skew_ms;
    uint32_t latency_ms;
    const char *peer_host;
    int peer_core;
    uint32_t seed;
    ...;
} tpu_fault;
typedef struct tpu_scheduled_fault {
    uint32_t id;
    tpu_fault_kind kind;
    uint64_t at_step;
    uint32_t due_in_ms;
    ...;
} tpu_scheduled_fault;

typedef enum tpu_dtype { TPU_F32, TPU_BF16, ... } tpu_dtype;
typedef enum tpu_reduce_op { TPU_SUM, TPU_MEAN, TPU_MAX, TPU_MIN, ... } tpu_reduce_op;
typedef enum tpu_algo { TPU_ALGO_AUTO, TPU_ALGO_RING, TPU_ALGO_HD, TPU_ALGO_HIER, ... } tpu_algo;
typedef struct tpu_collective_options {
    tpu_algo algo;
    int reproducible;
    const int *group_assignment;
    size_t chunk_bytes;
    uint32_t iters;
    ...;
} tpu_collective_options;
typedef struct tpu_collective_stats {
    uint64_t seq;
    int num_replicas;
    uint32_t iters;
    uint64_t time_ns;
    uint64_t wall_ns;
    char algorithm[];
    char transport[];
    int num_failed;
    uint64_t time_p50_ns;
    ...;
} tpu_collective_stats;
typedef struct tpu_replica_result {
    tpu_status status;
    const char *message;
    uint64_t answered_mono_ms;
    uint64_t time_ns;
    const char *algorithm;
    uint64_t time_p50_ns;
    ...;
} tpu_replica_result;

typedef enum tpu_label_kind { TPU_LABELS_NONE, TPU_LABELS_SPARSE, TPU_LABELS_DENSE, ... } tpu_label_kind;
#define TPU_BORROW ...
#define TPU_AUTOTUNE ...
typedef int (*tpu_map_fn)(float *x, void *y, size_t rows, size_t x_dim, void *user);
typedef struct tpu_batch {
    const float *x;
    const void *y;
    size_t rows;
    size_t index;
    uint64_t wait_ns;
    ...;
} tpu_batch;
typedef struct tpu_idx {
    int dtype;
    int rank;
    size_t dims[4];
    size_t count;
    void *data;
    ...;
} tpu_idx;

typedef enum tpu_activation { TPU_ACT_LINEAR, TPU_ACT_RELU, TPU_ACT_SOFTMAX, TPU_ACT_TANH,
    TPU_ACT_SIGMOID, TPU_ACT_GELU, TPU_ACT_SOFTPLUS, TPU_ACT_SWISH, ... } tpu_activation;
typedef enum tpu_padding { TPU_PADDING_VALID, TPU_PADDING_SAME, ... } tpu_padding;
typedef enum tpu_loss { TPU_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY, TPU_LOSS_CATEGORICAL_CROSSENTROPY,
    TPU_LOSS_MEAN_SQUARED_ERROR, ... } tpu_loss;
typedef enum tpu_policy { TPU_POLICY_FLOAT32, TPU_POLICY_MIXED_BFLOAT16, ... } tpu_policy;
typedef enum tpu_optimizer_kind { TPU_OPT_SGD, TPU_OPT_ADAM, ... } tpu_optimizer_kind;
typedef enum tpu_lr_schedule_kind { TPU_LR_CONSTANT, TPU_LR_EXPONENTIAL_DECAY,
    TPU_LR_PIECEWISE_CONSTANT_DECAY, TPU_LR_COSINE_DECAY, ... } tpu_lr_schedule_kind;
typedef struct tpu_lr_schedule {
    tpu_lr_schedule_kind kind;
    ...;
} tpu_lr_schedule;
typedef struct tpu_optimizer {
    tpu_optimizer_kind kind;
    float learning_rate;
    float momentum;
    int nesterov;
    float beta_1;
    float beta_2;
    float epsilon;
    tpu_lr_schedule schedule;
    ...;
} tpu_optimizer;
typedef struct tpu_compile_options {
    tpu_optimizer optimizer;
    tpu_loss loss;
    int metrics_accuracy;
    unsigned steps_per_execution;
    tpu_policy policy;
    size_t batch_size;
    unsigned infeed_depth;
    int deterministic;
    uint64_t from_logits;
    ...;
} tpu_compile_options;
typedef struct tpu_logs {
    int epoch;
    double loss;
    double accuracy;
    int has_val;
    double val_loss;
    double val_accuracy;
    size_t batch;
    size_t batches;
    uint64_t step;
    double elapsed_s;
    double examples_per_s;
    ...;
} tpu_logs;
typedef struct tpu_step_stats {
    uint64_t step;
    uint64_t wall_ns;
    uint64_t input_wait_ns;
    uint64_t compute_ns;
    size_t rows;
    ...;
} tpu_step_stats;
typedef struct tpu_callback {
    tpu_status (*on_train_begin)(tpu_model *m, void *user);
    tpu_status (*on_epoch_begin)(tpu_model *m, int epoch, void *user);
    tpu_status (*on_batch_begin)(tpu_model *m, int epoch, size_t batch, void *user);
    tpu_status (*on_batch_end)(tpu_model *m, int epoch, size_t batch, const tpu_logs *logs, void *user);
    tpu_status (*on_epoch_end)(tpu_model *m, int epoch, const tpu_logs *logs, void *user);
    tpu_status (*on_train_end)(tpu_model *m, const tpu_logs *logs, void *user);
    void (*destroy)(void *user);
    void *user;
    ...;
} tpu_callback;
typedef enum tpu_elastic_batch { TPU_ELASTIC_KEEP_GLOBAL_BATCH, TPU_ELASTIC_KEEP_PER_REPLICA_BATCH, ... }
    tpu_elastic_batch;
typedef struct tpu_elastic_options {
    int max_losses;
    uint32_t wait_ms;
    int min_replicas;
    tpu_elastic_batch batch;
    const char *checkpoint;
    uint64_t snapshot_steps;
    ...;
} tpu_elastic_options;
typedef enum tpu_elastic_event_kind { TPU_ELASTIC_NOTICE, TPU_ELASTIC_RESTORED, TPU_ELASTIC_SHRUNK, TPU_ELASTIC_GREW, ... }
    tpu_elastic_event_kind;
typedef struct tpu_elastic_event {
    tpu_elastic_event_kind kind;
    uint64_t step;
    uint64_t restored_step;
    int replicas_before;
    int replicas_after;
    size_t global_batch_before;
    size_t global_batch_after;
    double seconds;
    char from[];
    char cause[];
    ...;
} tpu_elastic_event;
typedef struct tpu_fit_options {
    int epochs;
    int initial_epoch;
    int resume;
    tpu_dataset *validation_data;
    const tpu_callback *callbacks;
    size_t num_callbacks;
    const char *preemption_checkpoint;
    tpu_elastic_options elastic;
    ...;
} tpu_fit_options;
typedef void (*tpu_warning_fn)(const char *message, void *user);
typedef struct tpu_input_context {
    int num_input_pipelines;
    int input_pipeline_id;
    int num_replicas_in_sync;
    ...;
} tpu_input_context;
typedef tpu_status (*tpu_dataset_fn)(const tpu_input_context *ctx, void *user, tpu_dataset **out);
typedef enum tpu_step_fn { TPU_STEP_TRAIN, TPU_STEP_EVALUATE, TPU_STEP_PREDICT, ... } tpu_step_fn;
typedef struct tpu_step_outputs {
    tpu_per_replica *loss;
    tpu_per_replica *loss_sum;
    tpu_per_replica *correct;
    tpu_per_replica *examples;
    tpu_per_replica *predictions;
    ...;
} tpu_step_outputs;
#define TPU_AXIS_NONE ...
typedef struct tpu_local_value {
    int rank;
    size_t dims[2];
    const double *v;
    const float *x;
    const void *y;
    ...;
} tpu_local_value;

typedef struct tpu_profile_core {
    const char *host_id;
    int core;
    int replica_id;
    int64_t clock_offset_ns;
    uint64_t clock_error_ns;
    uint64_t events;
    uint64_t dropped;
    const char *tpu_type;
    ...;
} tpu_profile_core;
typedef struct tpu_profile_summary { ...; } tpu_profile_summary;
typedef struct tpu_eval_options {
    const tpu_callback *callbacks;
    size_t num_callbacks;
    ...;
} tpu_eval_options;

/* C's stdout, for the library's progress bar and the profiler's overview */
extern FILE *stdout;
int fflush(FILE *);
void free(void *);

/* Python functions the library calls (Keras callbacks, warnings) */
extern "Python" tpu_status _py_on_train_begin(tpu_model *, void *);
extern "Python" tpu_status _py_on_epoch_begin(tpu_model *, int, void *);
extern "Python" tpu_status _py_on_batch_begin(tpu_model *, int, size_t, void *);
extern "Python" tpu_status _py_on_batch_end(tpu_model *, int, size_t, const tpu_logs *, void *);
extern "Python" tpu_status _py_on_epoch_end(tpu_model *, int, const tpu_logs *, void *);
extern "Python" tpu_status _py_on_train_end(tpu_model *, const tpu_logs *, void *);
extern "Python" void _py_warning(const char *, void *);
"""


def declarations(include_dirs):
    """Every TPU_API declaration of the headers, preprocessed, without typedefs."""
    text = ""
    for h in HEADERS:
        for d in include_dirs:
            p = os.path.join(d, h)
            if os.path.exists(p):
                with open(p, encoding="utf-8") as f:
                    text += f.read() + "\n"
                break
        else:
            sys.exit("build_ffi.py: %s not found in %s" % (h, include_dirs))
    text = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#include"))
    cc = os.environ.get("CC", "cc")
    out = subprocess.run([cc, "-E", "-P", "-x", "c", "-"], input=text, capture_output=True, text=True,
                         check=True).stdout
    # split into top-level statements
    stmts, depth, cur = [], 0, ""
    for ch in out:
        cur += ch
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == ";" and depth == 0:
            stmts.append(" ".join(cur.split()))
            cur = ""
    # a type of the headers the Python layer does not use: declared without
    # fields (its layout from the header; pointers to it pass through) or,
    # for an enum, as the int it converts to, so its functions are there too
    known = set(re.findall(r"\b(tpu_\w+)\s*;", TYPES)) | set(re.findall(r"\}\s*(tpu_\w+)\s*;", TYPES))
    extra = []
    for st in stmts:
        m = re.match(r"typedef (struct|enum) (tpu_\w+) \{.*\} (tpu_\w+)\s*;$", st)
        if m and m.group(3) not in known:
            extra.append("typedef struct %s { ...; } %s;" % (m.group(2), m.group(3)) if m.group(1) == "struct"
                         else "typedef int %s;" % m.group(3))
    return "\n".join(extra + [s for s in stmts if not s.startswith("typedef") and "(" in s])


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: build_ffi.py INCLUDE_DIR... OUT.c")
    include_dirs, out_c = sys.argv[1:-1], sys.argv[-1]
    ffi = cffi.FFI()
    ffi.cdef(TYPES + declarations(include_dirs))
    ffi.set_source("tpuemu._tpuemu_cffi",
                   "#include <stdio.h>\n#include <stdlib.h>\n" + "".join("#include <%s>\n" % h for h in HEADERS))
    ffi.emit_c_code(out_c + ".tmp")
    # rewrite only on a change, so that make does not recompile for nothing
    with open(out_c + ".tmp", encoding="utf-8") as f:
        new = f.read()
    old = None
    if os.path.exists(out_c):
        with open(out_c, encoding="utf-8") as f:
            old = f.read()
    if new != old:
        os.replace(out_c + ".tmp", out_c)
    else:
        os.remove(out_c + ".tmp")


if __name__ == "__main__":
    main()
