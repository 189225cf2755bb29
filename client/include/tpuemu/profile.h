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
TPU_API void tpu_profile_free(tpu_profile *p);

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
} tpu_profile_core;
TPU_API tpu_status tpu_profile_core_info(const tpu_profile *p, size_t i, tpu_profile_core *out);

/* Writes the trace as Chrome trace-event JSON, gzip'd, to
 * LOGDIR/plugins/profile/RUN/HOST.trace.json.gz (RUN: the capture's UTC time,
 * YYYY_MM_DD_HH_MM_SS; HOST: this machine's name), the layout TensorBoard's
 * profile plugin reads. A process per host, a thread per core (and one for
 * its sends and one for its receives), flow arrows from each all-reduce
 * chunk's send to its receive. The file's path goes to path. */
TPU_API tpu_status tpu_profile_write(const tpu_profile *p, const char *logdir, char *path, size_t n);

/* Where the average step's time went, over every core and captured step:
 * fraction[] of the step in input (the core waited for infeed), compute
 * (forward and backward), all-reduce (gradients, including waiting for the
 * other cores), optimizer and idle (the rest of the step's period); the MXU
 * utilization of the matmuls after padding their shapes to the MXU (rows to
 * 8, the other dimensions to 128); the core (index into the profile's cores)
 * that arrives last at the all-reduce most often, how often and by how much
 * after the next latest on average, and whether that makes it a straggler
 * (last in at least half of the steps by at least a tenth of a step); the
 * bottleneck ("input", "compute", "all-reduce" or "idle") with its fix. */
enum { TPU_PROFILE_INPUT, TPU_PROFILE_COMPUTE, TPU_PROFILE_ALLREDUCE, TPU_PROFILE_OPTIMIZER, TPU_PROFILE_IDLE };
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
} tpu_profile_summary;
TPU_API tpu_status tpu_profile_summarize(const tpu_profile *p, tpu_profile_summary *out);

/* The average step on each core, split into input (infeed wait), compute,
 * all-reduce, optimizer and idle; MXU utilization; the core that arrives
 * last at the all-reduce. */
TPU_API void tpu_profile_print_overview(const tpu_profile *p, FILE *f);

#ifdef __cplusplus
}
#endif

#endif
