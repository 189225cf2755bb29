/* The profiler: what every core of the cluster did, step by step, in one
 * trace people can open (chrome://tracing, Perfetto, TensorBoard's profile
 * plugin), and a summary of where each step's time went.
 *
 * Every worker records its events all the time in a bounded ring (tpu-worker
 * --trace-events). A capture reads them from every core, maps each worker's
 * clock onto this process's CLOCK_MONOTONIC (clock offset estimated at capture
 * time, see tpu_profile_core_clock), and keeps them in the tpu_profile.
 *
 *   tpu_profile *p;
 *   if (tpu_profile_capture(cluster, 2000, &p) == TPU_OK) {   // capture_tpu_profile --duration_ms 2000
 *       tpu_profile_write(p, "logs", path, sizeof path);      // logs/plugins/profile/RUN/HOST.trace.json.gz
 *       tpu_profile_print_overview(p, stdout);
 *       tpu_profile_free(p);
 *   }
 *
 * Thread-safe as long as one profile is used by one thread at a time. */
#ifndef TPUEMU_PROFILE_H
#define TPUEMU_PROFILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tpuemu/tpuemu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpu_profile tpu_profile;

/* Records for duration_ms from now the events of every core of the cluster
 * (the initialized system's cores; every live core when none is initialized),
 * reading them as it goes so the workers' rings never overflow. duration_ms 0
 * takes what the rings hold now. Errors: TPU_UNAVAILABLE naming the core that
 * could not be reached; TPU_NOT_FOUND when the cluster has no live core. */
TPU_API tpu_status tpu_profile_capture(tpu_cluster *c, uint32_t duration_ms, tpu_profile **out);
/* capture_tpu_profile --service_addr: the same capture of the cores of the
 * hosts named by their profiler addresses. service_addr is one host's
 * profiler address ("HOST:PORT", "grpc://HOST:PORT", a bare HOST for port
 * 8466, TensorFlow's profiler port) or a comma list of them. Each host's
 * profiler port (tpu-worker --profiler-port) is served by its core 0, which
 * answers with its host id and the resolver its cores register with; the
 * capture then reads every live core of those hosts (from that resolver's
 * cluster spec) directly. r gives the cluster token and the deadline of each
 * call (its endpoints are not used). Errors: TPU_INVALID_ARGUMENT (a bad
 * address, a core's data port, hosts of different resolvers), TPU_UNAVAILABLE
 * naming the address nothing answers at, TPU_NOT_FOUND (a host without a live
 * core). */
TPU_API tpu_status tpu_profile_capture_hosts(tpu_resolver *r, const char *service_addr, uint32_t duration_ms,
                                             tpu_profile **out);
TPU_API void tpu_profile_free(tpu_profile *p);
/* Names layer `layer` (0-based, as the cores number a model's layers) in the
 * overview, the summary's advice and the trace ("conv2d forward",
 * "multi_head_attention matmul ..."). Without it layer l is called as a Dense
 * stack's: "dense", "dense_1", ... The profiler callback names them after the
 * model's layers (Keras' names) itself. TPU_INVALID_ARGUMENT for a layer
 * beyond TPU_PROFILE_MAX_LAYERS or an empty name. */
TPU_API tpu_status tpu_profile_set_layer_name(tpu_profile *p, size_t layer, const char *name);

TPU_API size_t tpu_profile_num_cores(const tpu_profile *p);
TPU_API size_t tpu_profile_num_events(const tpu_profile *p);
/* Core i (in replica order): its host and index, the estimated offset of its
 * clock from ours (worker minus client, ns) and the bound of that estimate's
 * error (half the round trip it was measured with, ns), and the events its
 * ring had to drop before they were read. */
typedef struct tpu_profile_core {
    const char *host_id;
    int core;
    int replica_id;
    int64_t clock_offset_ns;
    uint64_t clock_error_ns;
    uint64_t events;
    uint64_t dropped;
    const char *tpu_type;    /* the generation it emulates */
    uint64_t hbm_used, hbm_peak, hbm_capacity; /* bytes, at the end of the capture */
    uint64_t reserved[8];                      /* zero: room to grow (docs/api/conventions.md) */
} tpu_profile_core;
TPU_API tpu_status tpu_profile_core_info(const tpu_profile *p, size_t i, tpu_profile_core *out);

/* Writes the trace as Chrome trace-event JSON, gzip'd, to
 * LOGDIR/plugins/profile/RUN/HOST.trace.json.gz (RUN: the capture's local
 * time, YYYY_MM_DD_HH_MM_SS, as TensorFlow names its runs; HOST: this
 * machine's name), the layout TensorBoard's profile plugin reads. A process per host, a thread per core (and one for
 * its sends and one for its receives), flow arrows from each all-reduce
 * chunk's send to its receive. The file's path goes to path. Unless LOGDIR
 * holds one already, it also makes the empty event file TensorFlow makes
 * there, events.out.tfevents.SECONDS.HOST.profile-empty, so TensorBoard lists
 * LOGDIR as a run. */
TPU_API tpu_status tpu_profile_write(const tpu_profile *p, const char *logdir, char *path, size_t n);

/* Where the average step's time went, over every core and captured step:
 * fraction[] of the step in input (the core waited for infeed), compute
 * (forward and backward), all-reduce (gradients, including waiting for the
 * other cores), optimizer and idle (the rest of the step's period); the MXU
 * utilization of the matmuls after padding their shapes to the MXU (rows to
 * 8, the other dimensions to 128), and per layer, with what its padding
 * costs; the core (index into the profile's cores) that arrives last at the
 * all-reduce most often, how often and by how much after the next latest on
 * average, and whether that makes it a straggler (over at least 4 steps,
 * last in at least half of them and in 1.5 times its 1/n share, as one of 2
 * cores is always last, by at least a tenth of a step); the highest HBM peak
 * of any core;
 * the bottleneck ("input", "compute", "memory", "all-reduce" or "idle") with
 * its fix: memory when a core's HBM peak is 90% of its capacity, else input
 * when the step is HIGHLY input-bound (the overview page's first focus),
 * else the largest of compute, all-reduce and idle (when MODERATELY
 * input-bound the fix names the input pipeline too); and the roofline
 * estimate of the same step on the real generation.
 *
 * The estimate, per core and step (the generation's published peaks, sent
 * by the workers): each matmul takes the longer of its FLOPs padded to the
 * generation's MXU (rows to 8, the rest to its size) over the peak bf16
 * FLOP/s and its operands' bytes (bf16) over the HBM bandwidth; the
 * optimizer reads the weights, gradients and a slot and writes the weights and
 * the slot (f32) at the HBM bandwidth; the all-reduce moves its bytes times
 * 2(n-1)/n over the core's share of the chip's ICI bandwidth. Nothing
 * overlaps. It is an estimate, not a measurement. */
enum { TPU_PROFILE_INPUT, TPU_PROFILE_COMPUTE, TPU_PROFILE_ALLREDUCE, TPU_PROFILE_OPTIMIZER, TPU_PROFILE_IDLE };
#define TPU_PROFILE_MAX_LAYERS 16
typedef struct tpu_profile_layer {
    unsigned layer;          /* 0-based: 0 is "dense", 1 "dense_1", as the trace names them */
    double mxu_utilization;  /* of its forward and backward matmuls */
    char padding[192];       /* what padding costs, e.g. "100 units padded to 128 (78%)"; "" when nothing */
    uint64_t reserved[8];    /* zero: room to grow (docs/api/conventions.md) */
} tpu_profile_layer;
typedef struct tpu_profile_summary {
    size_t steps;            /* core-steps with a full period in the capture */
    double step_ms;
    double fraction[5];
    double mxu_utilization;
    int last_core;
    double last_share, last_by_ms;
    int straggler;           /* -1: none */
    const char *bottleneck;  /* static strings */
    const char *advice;
    /* the MXU per layer, and what to do about a low utilization ("" when it is 90% or more) */
    size_t num_layers;
    tpu_profile_layer layers[TPU_PROFILE_MAX_LAYERS];
    char mxu_advice[320];
    /* HBM: the highest peak over capacity of any core, and which */
    double hbm_peak_fraction;
    int hbm_core;
    /* the roofline estimate of the step on the real generation, ms */
    const char *tpu_type;
    double est_step_ms, est_matmul_ms, est_optimizer_ms, est_allreduce_ms;
    size_t est_ops, est_hbm_bound_ops; /* matmuls per step, of which bound by HBM bandwidth */
    /* The input-bound classes of TensorFlow's profiler overview page
     * (tensorflow/core/profiler/convert/op_stats_to_input_pipeline_analysis.cc,
     * InputAnalysis): with input = fraction[TPU_PROFILE_INPUT] of the step,
     * "HIGHLY input-bound" from 20%, "MODERATELY input-bound" from 5%, "NOT
     * input-bound" below ("unknown" without a step); its
     * input_classification "host", "both", "device" ("unknown"), and its
     * statement ("Your program is HIGHLY input-bound because 23.4% of the
     * total step time sampled is waiting for input. ..."). */
    const char *input_bound;
    const char *input_classification;
    char input_statement[320];
    /* Each step's gradient all-reduce as the cores met in it (median over the
     * steps every core shows, 0 with one core): how far apart they reached it
     * (the last core's arrival after the first's) and how long it ran after
     * the last one arrived. The first is waiting, for a straggler or for
     * CPUs that emulated cores share; the second is the exchange itself. */
    double ar_spread_ms, ar_after_last_ms;
    /* The machine whose captured cores most outnumber its CPUs (cores are
     * grouped by the kernel they run on, so processes, containers and network
     * namespaces of one machine count together): shared_cores emulated cores
     * take turns on shared_cpus CPUs there, and a core's all-reduce includes
     * waiting for the others' turns. Both 0 when no machine has more cores
     * than CPUs. */
    unsigned shared_cores, shared_cpus;
    /* The roofline of the layers without matmuls (pooling, normalization,
     * embedding lookups, Add, Dropout): the bytes each pass reads and writes
     * over HBM bandwidth, ms per step; part of est_step_ms. */
    double est_other_ms;
    uint64_t reserved[7]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_profile_summary;
TPU_API tpu_status tpu_profile_summarize(const tpu_profile *p, tpu_profile_summary *out);

/* The average step on each core, split into input (infeed wait), compute,
 * all-reduce, optimizer and idle; MXU utilization; the core that arrives
 * last at the all-reduce. */
TPU_API void tpu_profile_print_overview(const tpu_profile *p, FILE *f);
/* The same as one JSON object (the summary, each core's split and clock,
 * the estimate). tpu_profile_write also writes it beside the trace, as
 * HOST.overview.json. */
TPU_API tpu_status tpu_profile_write_overview_json(const tpu_profile *p, FILE *f);

/* Draws where each step's time went as an SVG picture at path: a stacked
 * bar per step over the capture (the average over the cores; binned to at
 * most 200 bars) and one per core (its average step), in the overview's
 * parts. Each bar's numbers are in data- attributes (data-step, data-core,
 * data-part, data-ms). Written beside path and renamed into place. */
TPU_API tpu_status tpu_profile_plot_svg(const tpu_profile *p, const char *path);

#ifdef __cplusplus
}
#endif

#endif
