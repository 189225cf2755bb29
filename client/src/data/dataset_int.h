/* What training (train/fit.c) needs of an input pipeline beyond the public
 * API. Never installed. */
#ifndef TPUEMU_CLIENT_DATASET_INT_H
#define TPUEMU_CLIENT_DATASET_INT_H

#include <stddef.h>

#include "client.h"
#include "tpuemu/data.h"

/* The pipeline's batch() takes batch_size rows from now on (elastic fit
 * keeping the per-replica batch). */
int dataset_rebatch(tpu_dataset *ds, size_t batch_size, err *e);

#endif
