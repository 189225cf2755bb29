/* libtpuclient's model internals shared by model.c (building, compiling,
 * state, checkpoints), fit.c (fit, evaluate, predict) and callbacks.c.
 * Never installed. */
#ifndef TPUEMU_CLIENT_MODEL_INT_H
#define TPUEMU_CLIENT_MODEL_INT_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"
#include "coll.h"
#include "dataset_int.h"
#include "layershape.h"
#include "tpuemu/model.h"
#include "train_io.h"

#define MAGIC_STRATEGY 0x74707567u /* "tpug" */
#define MAGIC_MODEL 0x7470756du    /* "tpum" */
#define MODEL_LAYERS_MAX 16
#define MODEL_UNITS_MAX 65536

struct tpu_strategy {
    uint32_t magic;
    tpu_cluster *c;
};

struct fit_cache;

struct tpu_model {
    uint32_t magic;
    struct fit_cache *fit_cache; /* fit.c: what its runs keep between epochs */
    tpu_strategy *s;
    uint64_t id;          /* sent with every request; new per tpu_model_new */
    size_t in_dim, nlayers;
    size_t units[MODEL_LAYERS_MAX];
    tpu_activation act[MODEL_LAYERS_MAX];
    struct lspec spec[MODEL_LAYERS_MAX];   /* kind and options (units, act as above) */
    struct lshape in_shape;               /* per example; rank 0: (in_dim) */
    int remat;                            /* gradient checkpointing */
    uint64_t seed;
    int configured;       /* compile options set */
    tpu_compile_options co;
    /* on the cores */
    uint64_t epoch;       /* system epoch it is compiled in; 0: not compiled */
    size_t n;             /* replicas it is compiled on */
    size_t batch_per_core;/* compiled for */
    uint64_t hbm_used, hbm_capacity;
    tpu_notice notice;        /* the last notice a training answer carried (tpu_model_notice) */
    int notice_replica;       /* from which replica; -1: none */
    /* where training is */
    uint64_t step;
    int cur_epoch;
    size_t cur_batch;
    uint64_t iterations;  /* optimizer steps (from the cores) */
    /* a checkpoint loaded before the first compile: pushed at compile */
    float *pending_state;
    size_t pending_floats;
    uint32_t pending_slots;
    uint64_t pending_iterations;
    tpu_step_stats last;
    int fit_epochs;       /* the running fit's `epochs` (progress bar) */
    /* warned about this global batch already */
    size_t warned_batch;
    /* elastic fit re-sharded the model: a global batch need not split evenly */
    int resharded;
};

/* The model's state and position in client memory: a checkpoint file read
 * back, or replica 0's state read now (elastic fit). */
struct model_snap {
    float *state;          /* floats: parameters, then each optimizer slot's */
    size_t floats;
    uint32_t slots;
    uint64_t step, iterations;
    int epoch;
    size_t batch;          /* in the epoch, in batches of the dataset's batch size when it was taken */
};
int model_snap_read(tpu_model *m, const char *path, struct model_snap *out, err *e);
int model_snap_take(tpu_model *m, struct model_snap *out, err *e);
int model_snap_apply(tpu_model *m, const struct model_snap *s, err *e);
void model_snap_free(struct model_snap *s);

/* Compiles onto the cores if not compiled in this epoch for at least
 * global_batch (rounded up per core). */
int model_ensure_compiled(tpu_model *m, size_t global_batch, err *e);
/* Layer l's geometry (input shape into *in when not NULL); -1 when the
 * layers do not fit together (why says how). */
int model_layer_geom(const tpu_model *m, size_t l, struct lshape *in, struct lgeom *g, char *why, size_t n);
/* "conv2d_1": layer l's Keras name. */
void model_layer_name(const tpu_model *m, size_t l, char *buf, size_t n);
/* Number of trainable floats and optimizer slots. */
size_t model_nparams(const tpu_model *m);
/* Collectives each training step runs before its gradients' all-reduce:
 * 3 per synchronized BatchNormalization (the cores' model_sync_calls). */
uint64_t model_sync_calls_per_step(const tpu_model *m);
int model_nslots(const tpu_model *m);

/* The step's times as its slowest core saw them: each field the largest of
 * the cores' answers so far, and allreduce_min_ns the smallest non-zero
 * all-reduce (a NULL answer changes nothing). */
static inline void model_stats_max(tpu_step_stats *s, const struct tio_stat *a)
{
    if (!a)
        return;
#define MAXF(f) if (a->f > s->f) s->f = a->f
    MAXF(compute_ns);
    MAXF(matmul_ns);
    MAXF(allreduce_ns);
    MAXF(optimizer_ns);
    MAXF(infeed_wait_ns);
#undef MAXF
    uint64_t least = a->allreduce_min_ns ? a->allreduce_min_ns : a->allreduce_ns; /* fanned out: already the least */
    if (least && (!s->allreduce_min_ns || least < s->allreduce_min_ns))
        s->allreduce_min_ns = least;
}
/* Frees what fit keeps in the model (tpu_model_free). */
void fit_cache_free(tpu_model *m);

/* Deadline for a request moving bytes (per replica) */
uint64_t model_deadline(tpu_cluster *c, size_t bytes);

#endif
