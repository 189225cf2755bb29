/* tpuctl's TensorFlow view of a topology (topo.c). */
#ifndef TPUCTL_TOPO_H
#define TPUCTL_TOPO_H

#include <stddef.h>

#include "json.h"
#include "table.h"
#include "tpuctl.h"

/* The job of the device names tpuctl prints: TPUClusterResolver's default. */
#define TPUCTL_TOPO_JOB "worker"

/* "/job:worker/task:T/device:TPU:D" of the device at coords, or "-". */
const char *tpuctl_topo_device(const tpu_topology *t, const int coords[4], char *buf, size_t n);
/* "device_coordinates", "missing_devices", "serialized" (base64; null when
 * the hosts differ in size) into the open object. */
void tpuctl_topo_json(json *j, const tpu_topology *t);
/* "no device at [x, y, z, c]" lines and the serialized size. */
void tpuctl_topo_text(const tpu_topology *t);
/* Writes the TopologyProto bytes to path; an exit status. */
int tpuctl_topo_save(const tpu_topology *t, const char *path);
/* tpuctl topology FILE */
int tpuctl_cmd_topology(const struct tpuctl *g, int argc, char **argv);

#endif
