/* TensorBoard event files, as TensorFlow's summary writer makes them:
 * DIR/events.out.tfevents.SECONDS.HOST.PID.UID.v2 (TF2's
 * create_file_writer_v2 name: tensorflow/core/util/events_writer.cc plus the
 * ".PID.UID" and ".v2" suffix of tensorflow/python/ops/summary_ops_v2.py), a
 * sequence of TFRecords (uint64 length, masked CRC32C of the length, the
 * data, masked CRC32C of the data: tensorflow/core/lib/io/record_writer.cc)
 * each holding one Event proto (tensorflow/core/util/event.proto). The first
 * is the file_version "brain.Event:2"; then one Event per scalar, written the
 * way tf.summary.scalar does (tensorboard/plugins/scalar/summary_v2.py: a
 * rank-0 DT_FLOAT tensor in tensor_content, metadata plugin "scalars";
 * tensorflow/core/summary/summary_file_writer.cc WriteTensor). Never
 * installed. */
#ifndef TPUEMU_CLIENT_TFEVENTS_H
#define TPUEMU_CLIENT_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "status.h"

typedef struct tfevents {
    FILE *f;
    char path[4400];
} tfevents;

/* Creates dir (and its parents) and the event file in it, and writes the
 * file_version event. */
int tfevents_open(tfevents *w, const char *dir, err *e);
/* TensorFlow's MaybeCreateEmptyEventFile (tensorflow/core/profiler/rpc/
 * client/save_profile.cc): unless dir holds a file ending in
 * ".profile-empty", creates events.out.tfevents.SECONDS.HOST.profile-empty
 * there, holding only the file_version event, so TensorBoard lists dir as a
 * run and finds its profile plugin's directory. */
int tfevents_profile_empty(const char *dir, err *e);
/* One Event at step with one scalar summary value tag = v, written and flushed. */
int tfevents_scalar(tfevents *w, const char *tag, int64_t step, float v, err *e);
/* Closes the file (a no-op when it was not opened). */
int tfevents_close(tfevents *w, err *e);

/* CRC32C (Castagnoli) of p[0..n), and TFRecord's mask of it. */
uint32_t tfevents_crc32c(const void *p, size_t n);
uint32_t tfevents_masked_crc(const void *p, size_t n);

/* Creates dir and every missing parent (0755). 0, or -1 with errno. */
int tfevents_mkdirs(const char *dir);

#endif
