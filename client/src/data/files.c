/* Datasets the hosts read from files (tpuemu/data.h): a tpu_file_dataset is
 * a pipeline spec (common/input/hostin.h) built one transformation at a
 * time; tpu_strategy_distribute_datasets_from_files turns it into a dataset
 * fit takes. This file only builds and checks the spec. */
#include "client.h"
#include "hostin.h"
#include "tpuemu/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC_FILES 0x74706664u /* "tpfd" */

struct tpu_file_dataset {
    uint32_t magic;
    struct hin_spec spec;
};

const struct hin_spec *file_dataset_spec(const tpu_file_dataset *fd);

static tpu_file_dataset *files_of(const tpu_file_dataset *fd)
{
    CHECK_HANDLE(fd, MAGIC_FILES, "tpu_file_dataset");
    return (tpu_file_dataset *)fd;
}

const struct hin_spec *file_dataset_spec(const tpu_file_dataset *fd)
{
    return &files_of(fd)->spec;
}

tpu_status tpu_file_dataset_from_idx(const char *images, const char *labels, tpu_file_dataset **out)
{
    static const char *const fn = "tpu_file_dataset_from_idx";
    tpu_file_dataset *fd;
    err e;
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: out is NULL", fn);
    *out = NULL;
    if (!images || !*images || !labels || !*labels)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: no %s file", fn, !images || !*images ? "images" : "labels");
    if (strlen(images) >= HIN_PATH_MAX || strlen(labels) >= HIN_PATH_MAX)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: a file name is longer than %d bytes", fn, HIN_PATH_MAX - 1);
    if (!(fd = calloc(1, sizeof *fd)))
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "%s: out of memory", fn);
    snprintf(fd->spec.images, sizeof fd->spec.images, "%s", images);
    snprintf(fd->spec.labels, sizeof fd->spec.labels, "%s", labels);
    err_clear(&e);
    if (hin_probe(&fd->spec, &e) != CODE_OK) {
        free(fd);
        return cli_fail(&e);
    }
    fd->magic = MAGIC_FILES;
    *out = fd;
    return TPU_OK;
}

void tpu_file_dataset_free(tpu_file_dataset *fd)
{
    if (!fd)
        return;
    files_of(fd)->magic = MAGIC_DEAD;
    free(fd);
}

/* Appends o if the spec stays valid. */
static tpu_status add(tpu_file_dataset *fd, const struct hin_op *o)
{
    struct hin_spec s;
    err e;
    files_of(fd);
    if (fd->spec.nops >= HIN_MAX_OPS)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: a file dataset has at most %d transformations",
                         hin_op_name(o->kind), HIN_MAX_OPS);
    s = fd->spec;
    s.ops[s.nops++] = *o;
    /* checked as a whole with a batch at the end, unless there is one */
    if (!hin_batch_size(&s) && s.nops < HIN_MAX_OPS)
        s.ops[s.nops++] = (struct hin_op){.kind = HIN_BATCH, .batch = 1};
    err_clear(&e);
    if (hin_spec_check(&s, &e) != CODE_OK)
        return cli_fail(&e);
    fd->spec.ops[fd->spec.nops++] = *o;
    return TPU_OK;
}

tpu_status tpu_file_dataset_map(tpu_file_dataset *fd, tpu_map_kind kind, float a, float b)
{
    files_of(fd);
    if (kind != TPU_MAP_SCALE && kind != TPU_MAP_SHIFT && kind != TPU_MAP_NORMALIZE)
        return cli_failf(TPU_INVALID_ARGUMENT,
                         "map: unknown kind %d (TPU_MAP_SCALE, TPU_MAP_SHIFT or "
                         "TPU_MAP_NORMALIZE)",
                         (int)kind);
    return add(fd, &(struct hin_op){.kind = (int)kind, .a = a, .b = b});
}

tpu_status tpu_file_dataset_shuffle(tpu_file_dataset *fd, size_t buffer_size, uint64_t seed)
{
    return add(fd, &(struct hin_op){.kind = HIN_SHUFFLE, .buffer = buffer_size, .seed = seed});
}

tpu_status tpu_file_dataset_batch(tpu_file_dataset *fd, size_t per_replica_batch, int drop_remainder)
{
    files_of(fd);
    if (!drop_remainder)
        return cli_failf(TPU_INVALID_ARGUMENT, "batch: a file dataset drops each shard's remainder "
                                               "(drop_remainder 1): every replica takes a full batch each step");
    if (per_replica_batch == 0 || per_replica_batch > HIN_MAX_BATCH)
        return cli_failf(TPU_INVALID_ARGUMENT, "batch: %zu rows per replica; 1..%u", per_replica_batch, HIN_MAX_BATCH);
    return add(fd, &(struct hin_op){.kind = HIN_BATCH, .batch = (uint32_t)per_replica_batch});
}

tpu_status tpu_file_dataset_cache(tpu_file_dataset *fd)
{
    return add(fd, &(struct hin_op){.kind = HIN_CACHE});
}

tpu_status tpu_file_dataset_prefetch(tpu_file_dataset *fd, int n)
{
    files_of(fd);
    if (n < 1 || n > HIN_MAX_PREFETCH)
        return cli_failf(TPU_INVALID_ARGUMENT, "prefetch: depth %d outside 1..%d", n, HIN_MAX_PREFETCH);
    if (!hin_batch_size(&fd->spec))
        return cli_failf(TPU_INVALID_ARGUMENT, "prefetch before batch(): prefetch keeps batches ready and comes "
                                               "last");
    return add(fd, &(struct hin_op){.kind = HIN_PREFETCH, .depth = (uint32_t)n});
}

size_t tpu_file_dataset_num_rows(const tpu_file_dataset *fd)
{
    return (size_t)files_of(fd)->spec.rows;
}

size_t tpu_file_dataset_x_dim(const tpu_file_dataset *fd)
{
    return files_of(fd)->spec.x_dim;
}
