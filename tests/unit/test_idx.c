/* Unit tests of the IDX reader (tpuemu/data.h): good files plain and gzip
 * (every data type, several gzip members), each kind of damage, a missing
 * file, limits, conversions; and Fashion-MNIST when the machine has it.
 * Every file is written here, in a fresh temporary directory. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <zlib.h>

#include "tpuemu/data.h"

static char dir[64];

static void mkdir_tmp(void)
{
    snprintf(dir, sizeof dir, "/tmp/test_idx.XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void rm_tmp(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(idx, .init = mkdir_tmp, .fini = rm_tmp);

static const char *path_of(const char *name)
{
    static char p[4][160];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static const char *write_plain(const char *name, const void *buf, size_t n)
{
    const char *p = path_of(name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(buf, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
    return p;
}

/* gzip members, one per part (parts[i], lens[i]); `tail` bytes appended raw */
static const char *write_gz_parts(const char *name, const void *const *parts, const size_t *lens, int nparts,
                                  const void *tail, size_t ntail)
{
    const char *p = path_of(name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f);
    for (int i = 0; i < nparts; i++) {
        z_stream z;
        memset(&z, 0, sizeof z);
        cr_assert_eq(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
        size_t cap = deflateBound(&z, lens[i]) + 64;
        unsigned char *out = malloc(cap);
        z.next_in = (unsigned char *)parts[i];
        z.avail_in = (uInt)lens[i];
        z.next_out = out;
        z.avail_out = (uInt)cap;
        cr_assert_eq(deflate(&z, Z_FINISH), Z_STREAM_END);
        cr_assert_eq(fwrite(out, 1, z.total_out, f), z.total_out);
        deflateEnd(&z);
        free(out);
    }
    if (ntail)
        cr_assert_eq(fwrite(tail, 1, ntail, f), ntail);
    cr_assert_eq(fclose(f), 0);
    return p;
}

static const char *write_gz(const char *name, const void *buf, size_t n)
{
    const void *parts[] = {buf};
    size_t lens[] = {n};
    return write_gz_parts(name, parts, lens, 1, NULL, 0);
}

static unsigned char *read_all(const char *p, size_t *n)
{
    FILE *f = fopen(p, "rb");
    cr_assert_not_null(f);
    unsigned char *buf = malloc(1 << 20);
    *n = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

/* An IDX image: header for (dtype, dims), then `data` bytes as given. */
static unsigned char *make_idx(int dtype, int rank, const uint32_t *dims, const void *data, size_t nbytes,
                               size_t *len)
{
    unsigned char *b = malloc(4 + 4 * (size_t)rank + nbytes);
    b[0] = b[1] = 0;
    b[2] = (unsigned char)dtype;
    b[3] = (unsigned char)rank;
    for (int i = 0; i < rank; i++) {
        b[4 + 4 * i] = (unsigned char)(dims[i] >> 24);
        b[5 + 4 * i] = (unsigned char)(dims[i] >> 16);
        b[6 + 4 * i] = (unsigned char)(dims[i] >> 8);
        b[7 + 4 * i] = (unsigned char)dims[i];
    }
    if (nbytes)
        memcpy(b + 4 + 4 * rank, data, nbytes);
    *len = 4 + 4 * (size_t)rank + nbytes;
    return b;
}

/* 5 images of 3 x 4 pseudo-random bytes */
static unsigned char *images(size_t *len, unsigned char pix[60])
{
    uint32_t dims[] = {5, 3, 4}, s = 12345;
    for (int i = 0; i < 60; i++) {
        s = s * 1103515245u + 12345u;
        pix[i] = (unsigned char)(s >> 16);
    }
    return make_idx(0x08, 3, dims, pix, 60, len);
}

static void assert_images(const tpu_idx *a, const unsigned char pix[60])
{
    cr_assert_eq(a->dtype, 0x08);
    cr_assert_eq(a->rank, 3);
    cr_assert_eq(a->dims[0], 5);
    cr_assert_eq(a->dims[1], 3);
    cr_assert_eq(a->dims[2], 4);
    cr_assert_eq(a->count, 60);
    cr_assert_arr_eq(a->data, pix, 60);
}

/* Reading p fails with code, the message names the file and has `what`. */
static void assert_fails(const char *p, tpu_status code, const char *what)
{
    tpu_idx a;
    memset(&a, 0x5a, sizeof a);
    tpu_status s = tpu_idx_read(p, &a);
    cr_assert_eq(s, code, "%s: %s, not %s: %s", p, tpu_status_name(s), tpu_status_name(code), tpu_last_error());
    cr_assert_null(a.data, "zeroed on failure");
    cr_assert_eq(a.count, 0);
    cr_assert(strstr(tpu_last_error(), p), "the message names the file: %s", tpu_last_error());
    cr_assert(strstr(tpu_last_error(), what), "'%s' expected in: %s", what, tpu_last_error());
}

/* ---- good files ---- */

Test(idx, plain_and_gzip_unsigned_bytes)
{
    unsigned char pix[60];
    size_t len;
    unsigned char *b = images(&len, pix);
    tpu_idx a;
    cr_assert_eq(tpu_idx_read(write_plain("img-idx3-ubyte", b, len), &a), TPU_OK, "%s", tpu_last_error());
    assert_images(&a, pix);
    tpu_idx_free(&a);
    cr_assert_null(a.data);
    tpu_idx_free(NULL);
    cr_assert_eq(tpu_idx_read(write_gz("img-idx3-ubyte.gz", b, len), &a), TPU_OK, "%s", tpu_last_error());
    assert_images(&a, pix);
    tpu_idx_free(&a);
    free(b);
}

Test(idx, several_gzip_members_are_one_stream)
{
    unsigned char pix[60];
    size_t len;
    unsigned char *b = images(&len, pix);
    const void *parts[] = {b, b + 10, b + 37};
    size_t lens[] = {10, 27, len - 37};
    tpu_idx a;
    cr_assert_eq(tpu_idx_read(write_gz_parts("multi.gz", parts, lens, 3, NULL, 0), &a), TPU_OK, "%s",
                 tpu_last_error());
    assert_images(&a, pix);
    tpu_idx_free(&a);
    free(b);
}

Test(idx, multibyte_types_become_host_order)
{
    uint32_t dims[] = {3};
    size_t len;
    /* s16: -2, 258, 32767 */
    const unsigned char s16[] = {0xff, 0xfe, 0x01, 0x02, 0x7f, 0xff};
    /* s32: -1, 0x01020304, 7 */
    const unsigned char s32[] = {0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 0, 0, 0, 7};
    /* f32: 1.5, -2.0, 0.15625 */
    const unsigned char f32[] = {0x3f, 0xc0, 0, 0, 0xc0, 0, 0, 0, 0x3e, 0x20, 0, 0};
    /* f64: 1.0, -0.5, 1e10 */
    const unsigned char f64[] = {0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0xbf, 0xe0, 0, 0, 0, 0, 0, 0,
                                 0x42, 0x02, 0xa0, 0x5f, 0x20, 0, 0, 0};
    const signed char s8[] = {-3, 0, 100};
    struct {
        int dtype;
        const void *data;
        size_t n;
    } t[] = {{0x09, s8, 3}, {0x0B, s16, 6}, {0x0C, s32, 12}, {0x0D, f32, 12}, {0x0E, f64, 24}};
    for (int gz = 0; gz <= 1; gz++) {
        for (size_t k = 0; k < 5; k++) {
            unsigned char *b = make_idx(t[k].dtype, 1, dims, t[k].data, t[k].n, &len);
            char name[32];
            snprintf(name, sizeof name, "t%02x%s", t[k].dtype, gz ? ".gz" : "");
            const char *p = gz ? write_gz(name, b, len) : write_plain(name, b, len);
            tpu_idx a;
            cr_assert_eq(tpu_idx_read(p, &a), TPU_OK, "%s", tpu_last_error());
            cr_assert_eq(a.dtype, t[k].dtype);
            cr_assert_eq(a.count, 3);
            switch (t[k].dtype) {
            case 0x09:
                cr_assert_eq(((const int8_t *)a.data)[0], -3);
                cr_assert_eq(((const int8_t *)a.data)[2], 100);
                break;
            case 0x0B:
                cr_assert_eq(((const int16_t *)a.data)[0], -2);
                cr_assert_eq(((const int16_t *)a.data)[1], 258);
                cr_assert_eq(((const int16_t *)a.data)[2], 32767);
                break;
            case 0x0C:
                cr_assert_eq(((const int32_t *)a.data)[0], -1);
                cr_assert_eq(((const int32_t *)a.data)[1], 0x01020304);
                cr_assert_eq(((const int32_t *)a.data)[2], 7);
                break;
            case 0x0D:
                cr_assert_float_eq(((const float *)a.data)[0], 1.5f, 0);
                cr_assert_float_eq(((const float *)a.data)[1], -2.0f, 0);
                cr_assert_float_eq(((const float *)a.data)[2], 0.15625f, 0);
                break;
            case 0x0E:
                cr_assert_float_eq(((const double *)a.data)[0], 1.0, 0);
                cr_assert_float_eq(((const double *)a.data)[1], -0.5, 0);
                cr_assert_float_eq(((const double *)a.data)[2], 1e10, 0);
                break;
            }
            tpu_idx_free(&a);
            free(b);
        }
    }
}

Test(idx, rank_4_and_an_empty_array)
{
    uint32_t dims[] = {2, 1, 2, 2}, zero[] = {0, 28, 28};
    unsigned char d[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    size_t len;
    unsigned char *b = make_idx(0x08, 4, dims, d, 8, &len);
    tpu_idx a;
    cr_assert_eq(tpu_idx_read(write_plain("r4", b, len), &a), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(a.rank, 4);
    cr_assert_eq(a.count, 8);
    cr_assert_eq(a.dims[3], 2);
    tpu_idx_free(&a);
    free(b);
    b = make_idx(0x08, 3, zero, NULL, 0, &len);
    cr_assert_eq(tpu_idx_read(write_gz("empty.gz", b, len), &a), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(a.count, 0);
    cr_assert_eq(a.dims[1], 28);
    tpu_idx_free(&a);
    free(b);
}

Test(idx, conversions)
{
    unsigned char pix[60];
    size_t len;
    unsigned char *b = images(&len, pix);
    tpu_idx a;
    float *f;
    int32_t *l;
    cr_assert_eq(tpu_idx_read(write_plain("img", b, len), &a), TPU_OK);
    cr_assert_eq(tpu_idx_to_float(&a, 1 / 255.0f, &f), TPU_OK);
    cr_assert_eq(tpu_idx_to_labels(&a, &l), TPU_OK);
    for (int i = 0; i < 60; i++) {
        cr_assert_float_eq(f[i], pix[i] / 255.0f, 1e-6);
        cr_assert_eq(l[i], pix[i]);
    }
    free(f);
    free(l);
    tpu_idx_free(&a);
    free(b);

    uint32_t dims[] = {1};
    const unsigned char s16[] = {0, 1};
    b = make_idx(0x0B, 1, dims, s16, 2, &len);
    cr_assert_eq(tpu_idx_read(write_plain("s16", b, len), &a), TPU_OK);
    f = (float *)1;
    cr_assert_eq(tpu_idx_to_float(&a, 1, &f), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "0x0b, not 0x08"), "%s", tpu_last_error());
    cr_assert_eq(tpu_idx_to_labels(&a, &l), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_idx_to_labels(NULL, &l), TPU_INVALID_ARGUMENT);
    tpu_idx_free(&a);
    free(b);
}

/* ---- missing and damaged files ---- */

Test(idx, missing_file_and_bad_arguments)
{
    assert_fails(path_of("no-such-file.gz"), TPU_NOT_FOUND, "no such file");
    assert_fails(path_of("no-dir/x"), TPU_NOT_FOUND, "no such file");
    assert_fails(dir, TPU_INVALID_ARGUMENT, "directory");
    /* a FIFO no one writes: refused at once, not read from forever */
    cr_assert_eq(mkfifo(path_of("fifo"), 0600), 0);
    assert_fails(path_of("fifo"), TPU_INVALID_ARGUMENT, "FIFO");
    tpu_idx a;
    cr_assert_eq(tpu_idx_read(NULL, &a), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_idx_read("x", NULL), TPU_INVALID_ARGUMENT);
}

Test(idx, damaged_headers)
{
    unsigned char pix[60];
    size_t len;
    unsigned char *b = images(&len, pix), *c = malloc(len);
    assert_fails(write_plain("empty", b, 0), TPU_DATA_LOSS, "empty");
    assert_fails(write_plain("three", b, 3), TPU_DATA_LOSS, "truncated: 4 bytes of header expected, 3 found");
    assert_fails(write_plain("dims-cut", b, 9), TPU_DATA_LOSS, "truncated: 16 bytes of data expected, 9 found");
    assert_fails(write_gz("dims-cut.gz", b, 9), TPU_DATA_LOSS, "truncated: 16 bytes of data expected, 9 found");
    memcpy(c, b, len);
    c[0] = 'P';
    c[1] = 'K';
    assert_fails(write_plain("zip", c, len), TPU_DATA_LOSS, "not an IDX file: it starts with 50 4b");
    assert_fails(write_gz("zip.gz", c, len), TPU_DATA_LOSS, "not an IDX file");
    memcpy(c, b, len);
    c[2] = 0x07;
    assert_fails(write_plain("type", c, len), TPU_DATA_LOSS, "unknown data type 0x07");
    c[2] = 0x08;
    c[3] = 0;
    assert_fails(write_plain("rank0", c, len), TPU_INVALID_ARGUMENT, "rank 0 outside 1..4");
    c[3] = 5;
    assert_fails(write_gz("rank5.gz", c, len), TPU_INVALID_ARGUMENT, "rank 5 outside 1..4");
    free(b);
    free(c);
}

Test(idx, dims_that_disagree_with_the_size)
{
    unsigned char pix[60], big[80] = {0};
    size_t len;
    unsigned char *b = images(&len, pix);
    memcpy(big, b, len); /* 76 bytes: 16 of header, 60 of data */
    assert_fails(write_plain("short", b, len - 1), TPU_DATA_LOSS, "truncated: 76 bytes of data expected, 75 found");
    assert_fails(write_gz("short.gz", b, len - 1), TPU_DATA_LOSS, "truncated: 76 bytes of data expected, 75 found");
    assert_fails(write_plain("long", big, len + 4), TPU_DATA_LOSS, "trailing data: 76 bytes expected");
    assert_fails(write_plain("long", big, len + 4), TPU_DATA_LOSS, "80 found");
    assert_fails(write_gz("long.gz", big, len + 4), TPU_DATA_LOSS, "trailing data: 76 bytes expected");
    free(b);
}

Test(idx, damaged_gzip)
{
    size_t len, glen;
    /* a larger file, so the deflate stream has real blocks to damage */
    static unsigned char data[20000];
    uint32_t dims[] = {20000}, s = 7;
    for (size_t i = 0; i < sizeof data; i++) {
        s = s * 1103515245u + 12345u;
        data[i] = (unsigned char)((s >> 16) % 16);
    }
    unsigned char *b = make_idx(0x08, 1, dims, data, sizeof data, &len);
    const char *good = write_gz("good.gz", b, len);
    unsigned char *g = read_all(good, &glen);
    tpu_idx a;
    cr_assert_eq(tpu_idx_read(good, &a), TPU_OK, "%s", tpu_last_error());
    tpu_idx_free(&a);

    /* cut short: within the data, then just before the 8-byte trailer ends */
    assert_fails(write_plain("cut-half.gz", g, glen / 2), TPU_DATA_LOSS, "the gzip stream is cut short");
    assert_fails(write_plain("cut-half.gz", g, glen / 2), TPU_DATA_LOSS, "truncated: 20008 bytes of data expected");
    assert_fails(write_plain("cut-crc.gz", g, glen - 3), TPU_DATA_LOSS, "cut short");
    /* a flipped byte inside the deflate data, and in the CRC */
    unsigned char *c = malloc(glen);
    memcpy(c, g, glen);
    c[glen / 2] ^= 0x55;
    assert_fails(write_plain("flip.gz", c, glen), TPU_DATA_LOSS, "");
    memcpy(c, g, glen);
    c[glen - 6] ^= 0x01;
    assert_fails(write_plain("crc.gz", c, glen), TPU_DATA_LOSS, "corrupt gzip data");
    /* garbage after the stream */
    const void *parts[] = {b};
    size_t lens[] = {len};
    assert_fails(write_gz_parts("garbage.gz", parts, lens, 1, "junk", 4), TPU_DATA_LOSS,
                 "trailing garbage after the gzip stream");
    assert_fails(write_gz_parts("garbage1.gz", parts, lens, 1, "\x1f", 1), TPU_DATA_LOSS, "trailing garbage");
    free(c);
    free(g);
    free(b);
}

Test(idx, sizes_over_4_gib_are_refused_before_allocating)
{
    uint32_t huge[] = {0x40000000u, 5}, wrap[] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
             f64[] = {0x20000001u};
    size_t len;
    unsigned char *b = make_idx(0x08, 2, huge, NULL, 0, &len);
    assert_fails(write_plain("huge", b, len), TPU_RESOURCE_EXHAUSTED, "larger than the 4 GiB");
    assert_fails(write_gz("huge.gz", b, len), TPU_RESOURCE_EXHAUSTED, "dims 1073741824 x 5");
    free(b);
    b = make_idx(0x0C, 4, wrap, NULL, 0, &len);
    assert_fails(write_plain("wrap", b, len), TPU_RESOURCE_EXHAUSTED, "4 GiB");
    free(b);
    b = make_idx(0x0E, 1, f64, NULL, 0, &len);
    assert_fails(write_gz("f64.gz", b, len), TPU_RESOURCE_EXHAUSTED, "8-byte elements");
    free(b);
    /* a lying header in a small gzip file: truncated, without a 4 GiB allocation */
    uint32_t lie[] = {0xf0000000u};
    b = make_idx(0x08, 1, lie, "abc", 3, &len);
    assert_fails(write_gz("lie.gz", b, len), TPU_DATA_LOSS, "truncated: 4026531848 bytes of data expected, 11 found");
    free(b);
}

/* ---- the real thing, when installed ---- */

#define FMNIST "/usr/share/datasets/fashion-mnist"

Test(idx, fashion_mnist_if_installed, .timeout = 60)
{
    if (access(FMNIST "/train-images-idx3-ubyte.gz", R_OK) != 0 ||
        access(FMNIST "/train-labels-idx1-ubyte.gz", R_OK) != 0)
        cr_skip_test("Fashion-MNIST is not installed in " FMNIST " (Debian package dataset-fashion-mnist)");
    tpu_idx img, lab;
    cr_assert_eq(tpu_idx_read(FMNIST "/train-images-idx3-ubyte.gz", &img), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(tpu_idx_read(FMNIST "/train-labels-idx1-ubyte.gz", &lab), TPU_OK, "%s", tpu_last_error());
    cr_assert_eq(img.dtype, 0x08);
    cr_assert_eq(img.rank, 3);
    cr_assert_eq(img.dims[0], 60000);
    cr_assert_eq(img.dims[1], 28);
    cr_assert_eq(img.dims[2], 28);
    cr_assert_eq(lab.rank, 1);
    cr_assert_eq(lab.dims[0], 60000);
    int32_t *l;
    float *x;
    cr_assert_eq(tpu_idx_to_labels(&lab, &l), TPU_OK);
    cr_assert_eq(tpu_idx_to_float(&img, 1 / 255.0f, &x), TPU_OK);
    size_t per_class[10] = {0};
    for (size_t i = 0; i < 60000; i++) {
        cr_assert(l[i] >= 0 && l[i] <= 9, "label %d", l[i]);
        per_class[l[i]]++;
    }
    for (int k = 0; k < 10; k++)
        cr_assert_eq(per_class[k], 6000, "class %d", k);
    float mx = 0;
    for (size_t i = 0; i < img.count; i++)
        mx = x[i] > mx ? x[i] : mx;
    cr_assert_float_eq(mx, 1.0f, 1e-6);
    /* it feeds a pipeline as is */
    tpu_dataset *ds;
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 60000, 784, l, TPU_LABELS_SPARSE, 1, TPU_BORROW, &ds), TPU_OK);
    cr_assert_eq(tpu_dataset_batch(ds, 1024, 1), TPU_OK);
    cr_assert_eq(tpu_dataset_num_batches(ds), 58);
    tpu_dataset_free(ds);
    free(l);
    free(x);
    tpu_idx_free(&img);
    tpu_idx_free(&lab);
}
