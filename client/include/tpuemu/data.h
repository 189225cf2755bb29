/* tpuemu/data.h: input pipelines for training on the emulated pod, as
 * tf.data builds them, and a reader for the IDX files (Fashion-)MNIST ships in.
 *
 *   tpu_dataset *ds;
 *   tpu_dataset_from_tensor_slices(x, n, 784, y, TPU_LABELS_SPARSE, 1, 0, &ds);
 *   tpu_dataset_shuffle(ds, 10000, 42);
 *   tpu_dataset_batch(ds, 128 * replicas, 1);
 *   tpu_dataset_prefetch(ds, TPU_AUTOTUNE);
 *   tpu_dataset_iter *it;  tpu_batch b;
 *   tpu_dataset_iter_new(ds, 0, 0, &it);          // epoch 0 from its first batch
 *   while (tpu_dataset_iter_next(it, &b) == TPU_OK && b.rows) {
 *       ... use b.x, b.y ...
 *       tpu_dataset_iter_release(it, &b);
 *   }
 *   tpu_dataset_iter_free(it);
 *
 * A dataset is a description: the arrays (copied at creation, or borrowed with
 * TPU_BORROW), then transformations applied in the order they were added, as
 * tf.data chains them. Iterating it runs the pipeline for one epoch.
 *
 * Elements: before batch() an element is one row (x_dim floats, and a label:
 * one int32 class id for TPU_LABELS_SPARSE, y_dim floats for TPU_LABELS_DENSE,
 * nothing for TPU_LABELS_NONE). After batch() an element is a batch of rows,
 * stored contiguously (row-major x[rows][x_dim], y[rows] or y[rows][y_dim]),
 * so a batch splits into per-replica shards by row ranges without copying.
 *
 * Determinism: shuffle(buffer, seed) is tf.data's buffered shuffle (fill a
 * buffer of `buffer` elements, emit a uniformly chosen one, refill its slot
 * from the input) driven by a generator seeded from (seed, epoch): every epoch
 * gets a different order, and the same (seed, epoch) gives the same order on
 * every run and machine, which is what makes a restored checkpoint continue
 * exactly (the iterator can start at any epoch and batch).
 *
 * Threads: a dataset may be iterated by one iterator at a time (a second
 * tpu_dataset_iter_new, or a transformation added while an iterator lives,
 * fails with TPU_FAILED_PRECONDITION). prefetch()
 * runs the pipeline before it on a background thread of the iterator; map
 * callbacks then run on that thread. Handles follow tpuemu.h's conventions
 * (errors in tpu_last_error(), magic numbers, NULL-safe frees). */
#ifndef TPUEMU_DATA_H
#define TPUEMU_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "tpuemu/tpuemu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpu_label_kind {
    TPU_LABELS_NONE = 0,   /* x only (predict) */
    TPU_LABELS_SPARSE = 1, /* one int32 class id per row (y_dim must be 1) */
    TPU_LABELS_DENSE = 2,  /* y_dim floats per row (one-hot, regression targets) */
} tpu_label_kind;

/* flags of tpu_dataset_from_tensor_slices */
#define TPU_BORROW 1u /* do not copy x and y: the caller keeps them alive and unchanged */

/* prefetch(TPU_AUTOTUNE): the buffer starts at 2 batches and grows by one (up
 * to 16) each time the consumer finds it empty after the first batch, as
 * tf.data.AUTOTUNE tunes it. */
#define TPU_AUTOTUNE (-1)

/* Batches an iterator lets its consumer hold (not yet released) at once. */
#define TPU_MAX_HELD_BATCHES 32

typedef struct tpu_dataset tpu_dataset;

/* from_tensor_slices((x, y)): n rows of x_dim floats, and their labels as
 * described by kind/y_dim (y: int32_t[n] for SPARSE, float[n*y_dim] for DENSE,
 * NULL for NONE, whose y_dim is ignored and reads back as 0). Copies the
 * arrays unless flags has TPU_BORROW.
 * Errors: TPU_INVALID_ARGUMENT (x NULL, n or x_dim 0, sizes that overflow,
 * SPARSE with y_dim != 1, DENSE with y_dim 0, y missing or given for NONE, a
 * negative class id, unknown flags), TPU_RESOURCE_EXHAUSTED. */
TPU_API tpu_status tpu_dataset_from_tensor_slices(const float *x, size_t n, size_t x_dim, const void *y,
                                                  tpu_label_kind kind, size_t y_dim, unsigned flags,
                                                  tpu_dataset **out);
/* Frees the arrays it copied and every cache. Freeing a dataset that still
 * has an iterator is a bug and aborts. */
TPU_API void tpu_dataset_free(tpu_dataset *ds);

/* Transformations, applied in the order they are added. Each returns
 * TPU_INVALID_ARGUMENT for a bad parameter or an order the pipeline cannot
 * run (a second batch(), anything after prefetch()). shuffle, map and cache
 * after batch() are allowed and work on whole batches. */

/* shuffle(buffer_size, seed): buffer_size >= 1; reshuffled every epoch. A
 * buffer of at least the number of elements gives a uniform permutation; a
 * smaller one only moves an element within a window of buffer_size. The
 * buffer holds row indices, not rows, unless a map() came before it. */
TPU_API tpu_status tpu_dataset_shuffle(tpu_dataset *ds, size_t buffer_size, uint64_t seed);
/* batch(batch_size, drop_remainder): with drop_remainder 0 the last batch of
 * an epoch may be smaller. */
TPU_API tpu_status tpu_dataset_batch(tpu_dataset *ds, size_t batch_size, int drop_remainder);
/* map(fn): fn transforms one element in place (a row, or after batch() a whole
 * batch: rows rows). It may change values, not sizes; a non-zero return stops
 * the epoch with TPU_ABORTED naming the element. */
typedef int (*tpu_map_fn)(float *x, void *y, size_t rows, size_t x_dim, void *user);
TPU_API tpu_status tpu_dataset_map(tpu_dataset *ds, tpu_map_fn fn, void *user);
/* cache(): the elements produced so far in the pipeline are kept in memory
 * after the first complete epoch and replayed from then on (the stages before
 * it, map callbacks included, do not run again). As in tf.data, a cache after
 * a shuffle freezes the order of that first epoch; put the shuffle after the
 * cache to reshuffle every epoch. An epoch stopped early (iterator freed,
 * error) leaves the cache empty and the next iterator fills it again. Rows
 * that no map() changed are cached as indices; anything else is copied. */
TPU_API tpu_status tpu_dataset_cache(tpu_dataset *ds);
/* prefetch(n): a background thread keeps up to n elements (batches) ready.
 * 1 <= n <= 1024, or TPU_AUTOTUNE. Must be the last transformation. */
TPU_API tpu_status tpu_dataset_prefetch(tpu_dataset *ds, int n);

/* Rows in the source arrays, row width, label kind and width. */
TPU_API size_t tpu_dataset_num_rows(const tpu_dataset *ds);
TPU_API size_t tpu_dataset_x_dim(const tpu_dataset *ds);
TPU_API tpu_label_kind tpu_dataset_label_kind(const tpu_dataset *ds);
TPU_API size_t tpu_dataset_y_dim(const tpu_dataset *ds);
/* batch size (0 if the dataset is not batched) and its drop_remainder */
TPU_API size_t tpu_dataset_batch_size(const tpu_dataset *ds);
TPU_API int tpu_dataset_drop_remainder(const tpu_dataset *ds);
/* Batches one epoch yields (the cardinality): ceil or floor of rows/batch;
 * the number of rows if the dataset is not batched. */
TPU_API size_t tpu_dataset_num_batches(const tpu_dataset *ds);

/* One element as the iterator hands it out (an unbatched dataset hands out
 * one row per element, rows == 1). x, y are owned by the iterator and stay
 * valid until tpu_dataset_iter_release(it, b) or tpu_dataset_iter_free(it)
 * (at most TPU_MAX_HELD_BATCHES may be held at once; TPU_RESOURCE_EXHAUSTED
 * beyond). rows == 0 marks the end of the epoch. */
typedef struct tpu_batch {
    const float *x;  /* rows * x_dim */
    const void *y;   /* int32_t[rows], float[rows * y_dim], or NULL */
    size_t rows;
    size_t index;    /* 0-based position of this batch in its epoch */
    uint64_t wait_ns;/* how long tpu_dataset_iter_next waited for it (input-bound time;
                        without prefetch, the time it took to produce it) */
    void *opaque_;   /* the iterator's */
    uint64_t reserved[8]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_batch;

typedef struct tpu_dataset_iter tpu_dataset_iter;

/* Starts one epoch (0-based; it seeds the shuffle) at batch `skip` (the
 * batches before it are produced and dropped without running map callbacks
 * where the pipeline allows it: a map whose output goes straight to batch()
 * or to the consumer is not called for skipped elements, one that feeds a
 * shuffle or a filling cache is; without such a map, skipped rows are
 * skipped as indices, never copied). The result equals iterating from batch
 * 0 and dropping `skip` batches, for maps that are pure functions. With
 * prefetch the thread starts here. The dataset must outlive the iterator
 * and must not be changed while it lives.
 * Errors: TPU_FAILED_PRECONDITION (the dataset has an iterator already),
 * TPU_RESOURCE_EXHAUSTED. */
TPU_API tpu_status tpu_dataset_iter_new(tpu_dataset *ds, uint64_t epoch, size_t skip, tpu_dataset_iter **out);
/* Next element into *b (b->rows 0 at the end of the epoch, and again on every
 * call after it). Blocks while a prefetch thread is still producing it;
 * without prefetch it runs the pipeline itself. Errors: TPU_ABORTED (a map
 * callback failed; the message names the transformation and the element),
 * TPU_RESOURCE_EXHAUSTED (too many held, or out of memory). After an error
 * other than too-many-held the iterator returns that error again. */
TPU_API tpu_status tpu_dataset_iter_next(tpu_dataset_iter *it, tpu_batch *b);
/* Gives an element back; its buffers may be reused. Zeroes *b; NULL, an
 * already released b or the end marker are ignored. */
TPU_API void tpu_dataset_iter_release(tpu_dataset_iter *it, tpu_batch *b);
/* Stops the prefetch thread (joins it; a map callback running then is
 * finished first) and frees everything, batches still held included. */
TPU_API void tpu_dataset_iter_free(tpu_dataset_iter *it);
/* Current prefetch depth (what AUTOTUNE settled on; 0 without prefetch). */
TPU_API int tpu_dataset_iter_prefetch_depth(const tpu_dataset_iter *it);

/* ---- IDX files ((Fashion-)MNIST) ---- */

/* An IDX array read from a file, gzip-compressed or not (detected by its
 * magic bytes). dims[0] is the number of items. data is owned by the array. */
typedef struct tpu_idx {
    int dtype;        /* IDX type code: 0x08 unsigned byte, 0x09 signed byte, 0x0B s16, 0x0C s32, 0x0D f32, 0x0E f64 */
    int rank;         /* 1..4 */
    size_t dims[4];
    size_t count;     /* product of dims */
    void *data;       /* count elements, in host byte order */
    uint64_t reserved[8]; /* zero: room to grow (docs/api/conventions.md) */
} tpu_idx;

/* Reads path into *out (zeroed on failure; release it with tpu_idx_clear).
 * Errors name the file and what is wrong: TPU_NOT_FOUND (no such file),
 * TPU_PERMISSION_DENIED (not readable), TPU_DATA_LOSS (not an IDX file,
 * truncated, corrupt gzip, trailing data, dims that disagree with the size),
 * TPU_INVALID_ARGUMENT (rank outside 1..4, a directory),
 * TPU_RESOURCE_EXHAUSTED (larger than 4 GiB, out of memory), TPU_UNKNOWN
 * (another I/O error). */
TPU_API tpu_status tpu_idx_read(const char *path, tpu_idx *out);
/* Frees a->data and zeroes *a (the struct's contents: _clear; a handle's
 * end is _free). NULL-safe. */
TPU_API void tpu_idx_clear(tpu_idx *a);
/* Deprecated name of tpu_idx_clear (kept until the next SOVERSION). */
TPU_API void tpu_idx_free(tpu_idx *a);

/* Unsigned-byte images as floats scaled by `scale` (1/255.0f for pixels in
 * [0, 1]): a malloc'd float[count] the caller frees. TPU_INVALID_ARGUMENT if a
 * is not of type 0x08. */
TPU_API tpu_status tpu_idx_to_float(const tpu_idx *a, float scale, float **out);
/* Unsigned-byte labels as int32 class ids: malloc'd int32_t[count].
 * TPU_INVALID_ARGUMENT if a is not of type 0x08. */
TPU_API tpu_status tpu_idx_to_labels(const tpu_idx *a, int32_t **out);

/* ---- datasets the hosts read from files ----
 *
 *   tpu_file_dataset *fd;  tpu_dataset *ds;
 *   tpu_file_dataset_from_idx("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", &fd);
 *   tpu_file_dataset_map(fd, TPU_MAP_SCALE, 1 / 255.0f, 0);
 *   tpu_file_dataset_cache(fd);
 *   tpu_file_dataset_shuffle(fd, 60000, 42);
 *   tpu_file_dataset_batch(fd, 128, 1);                 // the per-replica batch
 *   tpu_file_dataset_prefetch(fd, 2);
 *   tpu_strategy_distribute_datasets_from_files(s, fd, TPU_INPUT_ON_HOSTS, &ds);  // tpuemu/model.h
 *   tpu_model_fit(m, ds, &fo, &history);
 *
 * What a dataset_fn of strategy.distribute_datasets_from_function builds in
 * TensorFlow, as a description that can travel: the files (which every host
 * must be able to read under the same paths), then transformations in the
 * order they are added. Each input pipeline reads the files itself and takes
 * its shard (dataset.shard(num_input_pipelines, input_pipeline_id): row i
 * belongs to pipeline i mod num_input_pipelines), then applies them. Maps are
 * built in (a C function cannot be sent to another host): each pixel is cast
 * from its unsigned byte to float, then each map applies in turn. batch() is
 * the per-replica batch and drops each shard's remainder (every replica takes
 * a full batch each step). shuffle() before batch() shuffles rows, after it
 * batches; it reshuffles every epoch unless a cache() follows it (which
 * freezes the first epoch's order, as in tf.data). cache() keeps the mapped
 * rows in memory. prefetch(n) keeps n batches ready on a thread of the
 * pipeline. Errors name the file or transformation that is wrong. */
typedef struct tpu_file_dataset tpu_file_dataset;

typedef enum tpu_map_kind {
    TPU_MAP_SCALE = 1,     /* x * a       (a = 1/255.0f: pixels in [0, 1]) */
    TPU_MAP_SHIFT = 2,     /* x + a */
    TPU_MAP_NORMALIZE = 3, /* (x - a) / b (a mean, b a non-zero deviation) */
} tpu_map_kind;

/* IDX files of unsigned bytes: images (rows x ...: each row is the product
 * of the other dims) and labels (one class id per row). Reads their headers
 * (not their data) to check them and learn the shape. Errors as
 * tpu_idx_read's, naming the file; TPU_INVALID_ARGUMENT for another IDX type,
 * or labels that are not one per image. */
TPU_API tpu_status tpu_file_dataset_from_idx(const char *images, const char *labels, tpu_file_dataset **out);
TPU_API void tpu_file_dataset_free(tpu_file_dataset *fd);
/* map(kind, a, b): before batch() only; a (and b) finite, b non-zero for NORMALIZE. */
TPU_API tpu_status tpu_file_dataset_map(tpu_file_dataset *fd, tpu_map_kind kind, float a, float b);
/* shuffle(buffer_size, seed): buffer_size >= 1; one before and one after batch() at most. */
TPU_API tpu_status tpu_file_dataset_shuffle(tpu_file_dataset *fd, size_t buffer_size, uint64_t seed);
/* batch(per_replica_batch, drop_remainder): drop_remainder must be 1. */
TPU_API tpu_status tpu_file_dataset_batch(tpu_file_dataset *fd, size_t per_replica_batch, int drop_remainder);
TPU_API tpu_status tpu_file_dataset_cache(tpu_file_dataset *fd);
/* prefetch(n): 1 <= n <= 64; last. */
TPU_API tpu_status tpu_file_dataset_prefetch(tpu_file_dataset *fd, int n);
/* Rows in the files, and values per row. */
TPU_API size_t tpu_file_dataset_num_rows(const tpu_file_dataset *fd);
TPU_API size_t tpu_file_dataset_x_dim(const tpu_file_dataset *fd);

#ifdef __cplusplus
}
#endif

#endif
