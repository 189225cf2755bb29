/* What a profile capture holds (struct tpu_profile): every core's events on
 * the client's clock, and what the core said of itself. Shared by the capture
 * (capture.c), the trace file (trace_json.c), the summary (summary.c) and the
 * overview (overview.c). Never installed. */
#ifndef TPUEMU_CLIENT_PROFILE_CAPTURE_H
#define TPUEMU_CLIENT_PROFILE_CAPTURE_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "client.h"
#include "dpio.h"
#include "profile_io.h"
#include "tpuemu/profile.h"

#define TK(k) PROF_KIND_##k
#define PROF_PROBES 8
#define PROF_POLL_MS 200u
#define PROF_MAX_ROUNDS 64            /* fetches of one read before giving up on a flood */
#define PROF_MAX_PAYLOAD (64u << 20)
#define PROF_IO_MS 5000u
#define PROF_HBM_TIGHT 0.9            /* HBM peak over capacity that makes memory the bottleneck */
#define PROF_STRAGGLER_STEPS 4       /* all-reduces compared before a core is called a straggler */
#define PROF_MXU_GOOD 0.9             /* utilization below which a layer's padding is named */

struct pev {
    uint32_t kind, layer, op, cstep, chunk;
    int32_t peer;
    int64_t t0;                       /* client clock, ns */
    uint64_t dur, step, m, n, k, bytes, seq;
    char algo[16];
};

struct pcore {
    struct dpio_conn peer;            /* its data connection, open while capturing */
    int replica;
    char tpu_type[16];
    int64_t offset;                   /* worker - client, ns */
    uint64_t hbm_used, hbm_peak, hbm_cap;
    double peak_flops, hbm_bw, ici_bw; /* the real generation's, per device */
    unsigned mxu_dim;
    unsigned host_cpus;               /* CPUs it may run on; 0: not said */
    char boot_id[40];                 /* its kernel's; "": not said */
    uint64_t err_ns, dropped, since_w, seq;
    struct pev *ev;
    size_t n, cap;
    const struct cli_cancel *cancel;  /* the capturing cluster handle's (tpu_cancel) */
    char missing[300];                /* why its events are not in the capture (it did not answer); "": they are */
};

struct tpu_profile {
    struct pcore *c;
    size_t n;
    int64_t start, end;               /* client clock, ns */
    time_t wall;
    char lname[TPU_PROFILE_MAX_LAYERS][48]; /* the model's layer names (tpu_profile_name_layers); "": none */
};
/* Layer l's name: the model's (tpu_profile_name_layers), else Keras' name of
 * a Dense stack's layer ("dense", "dense_1", ...). */
const char *profile_layer_name(const tpu_profile *p, size_t l, char *buf, size_t n);
static inline double pad(uint64_t v, uint64_t to)
{
    return (double)((v + to - 1) / to * to);
}

/* FLOPs of an m x k . k x n matmul and of its shape padded to the MXU (rows
 * of the left operand to 8, the rest to 128), as the worker's mxu counts them. */
static inline double mm_flops(const struct pev *e, double *padded)
{
    *padded = 2.0 * pad(e->m, 8) * pad(e->n, 128) * pad(e->k, 128);
    return 2.0 * (double)e->m * (double)e->n * (double)e->k;
}

/* s as a quoted JSON string in out (cut short, still quoted, when it does
 * not fit): for the trace file and the overview JSON. */
const char *profile_json_quote(const char *s, char *out, size_t n);

#endif
