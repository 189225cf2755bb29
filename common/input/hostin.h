/* Input pipelines that run on the hosts: a dataset read from IDX files every
 * host can read, described by a plain spec (what the client sends, never a
 * function pointer), sharded as tf.distribute.InputContext shards it
 * (dataset.shard(num_input_pipelines, input_pipeline_id): source row i
 * belongs to pipeline i mod num) and turned into per-replica batches.
 *
 * The same code runs in the worker's host process (host-side input: no
 * training data crosses the network) and in the client (the client-fed path
 * with the same sharding), so both give the same batches, bit for bit.
 *
 * Ops, in the spec's order: map (built-in and declarative: scale, shift,
 * normalize; a pixel is first cast from its unsigned byte to float), shuffle
 * (tf.data's buffered shuffle, before batch() over rows, after it over
 * batches; every epoch reshuffles unless a cache follows it, which freezes
 * the first epoch's order as tf.data does), batch (the per-replica batch;
 * the remainder of each shard is dropped: every replica takes a full batch
 * each step), cache (the mapped rows kept in memory, not mapped again) and
 * prefetch (a thread of the pipeline keeps the next batches ready). A batch
 * is addressed by (epoch, index), so a pipeline can resume anywhere. */
#ifndef TPUEMU_COMMON_HOSTIN_H
#define TPUEMU_COMMON_HOSTIN_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define HIN_PATH_MAX 1024
#define HIN_MAX_OPS 16
#define HIN_MAX_BATCH (1u << 20)
#define HIN_MAX_BUFFER (1ull << 32)
#define HIN_MAX_PREFETCH 64

enum hin_op_kind {
    HIN_MAP_SCALE = 1,     /* x * a */
    HIN_MAP_SHIFT = 2,     /* x + a */
    HIN_MAP_NORMALIZE = 3, /* (x - a) / b */
    HIN_SHUFFLE = 4,       /* buffer, seed */
    HIN_BATCH = 5,         /* batch (drop remainder) */
    HIN_CACHE = 6,
    HIN_PREFETCH = 7, /* depth */
};

struct hin_op {
    int kind;
    float a, b;
    uint64_t buffer, seed;
    uint32_t batch;
    uint32_t depth;
};

struct hin_spec {
    char images[HIN_PATH_MAX]; /* IDX of unsigned bytes: rows x ... */
    char labels[HIN_PATH_MAX]; /* IDX of unsigned bytes: rows class ids */
    uint64_t rows;             /* as the client read the headers: each host checks its files agree */
    uint32_t x_dim;
    struct hin_op ops[HIN_MAX_OPS];
    size_t nops;
};

/* "map", "shuffle", ... for messages. */
const char *hin_op_name(int kind);
/* Checks the ops and their order (one batch; maps before it; at most one
 * shuffle on each side of it and one cache; prefetch last) and the sizes. */
int hin_spec_check(const struct hin_spec *s, err *e);
/* The per-replica batch (0: no batch op). */
uint32_t hin_batch_size(const struct hin_spec *s);
/* Reads the files' headers (not their data) and sets s->rows and s->x_dim;
 * errors name the file and what is wrong with it. */
int hin_probe(struct hin_spec *s, err *e);
/* Full batches pipeline id of num yields per epoch. */
uint64_t hin_batches(const struct hin_spec *s, uint32_t id, uint32_t num);
/* Steps of an epoch when num pipelines feed num replicas together: the
 * fewest any pipeline yields. */
uint64_t hin_epoch_steps(const struct hin_spec *s, uint32_t num);

struct hin_pipe;
/* Pipeline id of num over s: reads the files (every host reads them
 * itself), checks them against the spec. */
int hin_open(const struct hin_spec *s, uint32_t id, uint32_t num, struct hin_pipe **out, err *e);
/* Is p the pipeline (s, id, num)? */
int hin_is(const struct hin_pipe *p, const struct hin_spec *s, uint32_t id, uint32_t num);
/* Batch `index` of `epoch`: batch_size rows of x_dim floats into x and their
 * class ids into y. CODE_OUT_OF_RANGE past the epoch's end. */
int hin_fill(struct hin_pipe *p, uint64_t epoch, uint64_t index, float *x, int32_t *y, err *e);
/* Has the prefetch thread batch `index` of `epoch` ready, so that hin_fill
 * only copies it (does not wait, gather or plan)? */
int hin_ready(struct hin_pipe *p, uint64_t epoch, uint64_t index);
void hin_close(struct hin_pipe *p);

#endif
