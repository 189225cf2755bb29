/* IDX files (tpuemu/data.h): the reader is common/input/idx.c, which the
 * workers' input pipelines use too; here its public face. */
#include "client.h"
#include "idx.h"
#include "tpuemu/data.h"

#include <stdlib.h>
#include <string.h>

tpu_status tpu_idx_read(const char *path, tpu_idx *out)
{
    struct idx_array a;
    err e;
    if (!out)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_idx_read: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path || !*path)
        return cli_failf(TPU_INVALID_ARGUMENT, "tpu_idx_read: no path");
    err_clear(&e);
    if (idx_read(path, &a, &e) != CODE_OK)
        return cli_fail(&e);
    out->dtype = a.dtype;
    out->rank = a.rank;
    memcpy(out->dims, a.dims, sizeof out->dims);
    out->count = a.count;
    out->data = a.data;
    return TPU_OK;
}

void tpu_idx_free(tpu_idx *a)
{
    tpu_idx_clear(a);
}

void tpu_idx_clear(tpu_idx *a)
{
    if (!a)
        return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

static tpu_status check_u8(const tpu_idx *a, const void *out, const char *fn)
{
    if (!a || !out)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: %s is NULL", fn, a ? "out" : "a");
    if (a->dtype != 0x08)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: the array is of IDX type 0x%02x, not 0x08 (unsigned byte)", fn,
                         a->dtype);
    if (a->count && !a->data)
        return cli_failf(TPU_INVALID_ARGUMENT, "%s: the array has no data", fn);
    return TPU_OK;
}

tpu_status tpu_idx_to_float(const tpu_idx *a, float scale, float **out)
{
    tpu_status st = check_u8(a, out, "tpu_idx_to_float");
    if (st != TPU_OK)
        return st;
    *out = NULL;
    float *f = malloc(a->count ? a->count * sizeof *f : 1);
    if (!f)
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "tpu_idx_to_float: out of memory for %zu floats", a->count);
    const unsigned char *p = a->data;
    for (size_t i = 0; i < a->count; i++)
        f[i] = (float)p[i] * scale;
    *out = f;
    return TPU_OK;
}

tpu_status tpu_idx_to_labels(const tpu_idx *a, int32_t **out)
{
    tpu_status st = check_u8(a, out, "tpu_idx_to_labels");
    if (st != TPU_OK)
        return st;
    *out = NULL;
    int32_t *l = malloc(a->count ? a->count * sizeof *l : 1);
    if (!l)
        return cli_failf(TPU_RESOURCE_EXHAUSTED, "tpu_idx_to_labels: out of memory for %zu labels", a->count);
    const unsigned char *p = a->data;
    for (size_t i = 0; i < a->count; i++)
        l[i] = p[i];
    *out = l;
    return TPU_OK;
}
