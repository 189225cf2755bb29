/* What training (train/fit.c) needs of an input pipeline beyond the public
 * API. Never installed. */
#ifndef TPUEMU_CLIENT_DATASET_INT_H
#define TPUEMU_CLIENT_DATASET_INT_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"
#include "tpuemu/data.h"

/* The pipeline's batch() takes batch_size rows from now on (elastic fit
 * keeping the per-replica batch). */
int dataset_rebatch(tpu_dataset *ds, size_t batch_size, err *e);

/* A dataset distributed from files over num input pipelines
 * (tpu_strategy_distribute_datasets_from_files): made from the spec, a
 * global batch of num per-replica batches, pipeline r's batch k in rows
 * [r x batch, (r + 1) x batch) of global batch k. on_hosts: each core's host
 * runs its pipeline and the client's iterator yields the batches' sizes
 * only (x and y NULL); else the client runs the same pipelines itself. */
struct hin_spec;
int dataset_from_files(const struct hin_spec *s, uint32_t num, int on_hosts, tpu_dataset **out, err *e);
/* Its spec (NULL for any other dataset), pipelines and placement. */
const struct hin_spec *dataset_files(const tpu_dataset *ds, uint32_t *num, int *on_hosts);

#endif
