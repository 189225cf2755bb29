/* Unit tests of the input pipelines the hosts run (common/input/hostin.h),
 * on IDX files written here whose pixels say which source row they are:
 * each pipeline takes exactly its shard (row i to pipeline i mod num), an
 * epoch uses each of its rows once, a shuffle reshuffles every epoch unless a
 * cache follows it, a shuffle of batches moves whole batches, prefetch and
 * random access give the same batches as a plain pipeline, the maps compute
 * what they say, and a batch past the epoch or a spec that does not hold
 * together is refused naming it. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "hostin.h"
#include "scratch.h"

#define ROWS 1003
#define DIM 6
#define BS 10

static char dir[256], img[320], lab[320];

static void put_be32(FILE *f, uint32_t v)
{
    unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8),
                          (unsigned char)v};
    cr_assert_eq(fwrite(b, 1, 4, f), 4u);
}

/* pixel 0 and 1: the row's number (low, high byte), then 7, 8, 9, 10; label: row mod 10 */
static void setup(void)
{
    scratch_make(dir, sizeof dir, "test_hostin");
    snprintf(img, sizeof img, "%s/img", dir);
    snprintf(lab, sizeof lab, "%s/lab", dir);
    FILE *f = fopen(img, "wb"), *g = fopen(lab, "wb");
    cr_assert(f && g);
    fwrite("\0\0\x08\x02", 1, 4, f);
    put_be32(f, ROWS);
    put_be32(f, DIM);
    fwrite("\0\0\x08\x01", 1, 4, g);
    put_be32(g, ROWS);
    for (int i = 0; i < ROWS; i++) {
        unsigned char px[DIM] = {(unsigned char)(i & 255), (unsigned char)(i >> 8), 7, 8, 9, 10};
        unsigned char l = (unsigned char)(i % 10);
        cr_assert_eq(fwrite(px, 1, DIM, f), (size_t)DIM);
        cr_assert_eq(fwrite(&l, 1, 1, g), 1u);
    }
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(fclose(g), 0);
}

static void teardown(void)
{
    scratch_remove(dir);
}

TestSuite(hostin, .init = setup, .fini = teardown);

static struct hin_spec spec(const struct hin_op *ops, size_t n)
{
    struct hin_spec s;
    err e;
    memset(&s, 0, sizeof s);
    snprintf(s.images, sizeof s.images, "%s", img);
    snprintf(s.labels, sizeof s.labels, "%s", lab);
    memcpy(s.ops, ops, n * sizeof *ops);
    s.nops = n;
    cr_assert_eq(hin_probe(&s, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(s.rows, ROWS);
    cr_assert_eq(s.x_dim, DIM);
    return s;
}

static struct hin_pipe *open_pipe(const struct hin_spec *s, uint32_t id, uint32_t num)
{
    struct hin_pipe *p;
    err e;
    cr_assert_eq(hin_open(s, id, num, &p, &e), CODE_OK, "%s", e.msg);
    return p;
}

/* The source rows of batch (epoch, index), checking labels agree. */
static void rows_of(struct hin_pipe *p, uint64_t epoch, uint64_t index, int *rows)
{
    float x[BS * DIM];
    int32_t y[BS];
    err e;
    cr_assert_eq(hin_fill(p, epoch, index, x, y, &e), CODE_OK, "%s", e.msg);
    for (int r = 0; r < BS; r++) {
        rows[r] = (int)x[r * DIM] + 256 * (int)x[r * DIM + 1];
        cr_assert_eq(y[r], rows[r] % 10, "row %d's label", rows[r]);
    }
}

/* One epoch of pipeline id of num: every row once, all of its shard. */
static void epoch_rows(struct hin_pipe *p, const struct hin_spec *s, uint32_t id, uint32_t num, uint64_t epoch,
                       int *order)
{
    uint64_t nb = hin_batches(s, id, num);
    char seen[ROWS] = {0};
    for (uint64_t k = 0; k < nb; k++) {
        rows_of(p, epoch, k, order + k * BS);
        for (int r = 0; r < BS; r++) {
            int row = order[k * BS + r];
            cr_assert(row >= 0 && row < ROWS && (uint32_t)row % num == id, "row %d in pipeline %u of %u", row, id, num);
            cr_assert(!seen[row], "row %d twice in epoch %llu", row, (unsigned long long)epoch);
            seen[row] = 1;
        }
    }
}

Test(hostin, each_pipeline_takes_its_shard_in_order)
{
    struct hin_spec s = spec((struct hin_op[]){{.kind = HIN_BATCH, .batch = BS}}, 1);
    cr_assert_eq(hin_batches(&s, 0, 3), 33u); /* 335 rows */
    cr_assert_eq(hin_batches(&s, 2, 3), 33u); /* 334 */
    cr_assert_eq(hin_epoch_steps(&s, 3), 33u);
    for (uint32_t id = 0; id < 3; id++) {
        struct hin_pipe *p = open_pipe(&s, id, 3);
        int rows[BS];
        rows_of(p, 0, 5, rows);
        for (int r = 0; r < BS; r++)
            cr_assert_eq(rows[r], (int)id + (5 * BS + r) * 3);
        float x[BS * DIM];
        int32_t y[BS];
        err e;
        cr_assert_eq(hin_fill(p, 0, 33, x, y, &e), CODE_OUT_OF_RANGE);
        cr_assert(strstr(e.msg, "past its 33 batches"), "%s", e.msg);
        hin_close(p);
    }
}

Test(hostin, shuffle_reshuffles_each_epoch_unless_a_cache_follows)
{
    static int a[ROWS], b[ROWS], c[ROWS];
    struct hin_spec s = spec(
        (struct hin_op[]){{.kind = HIN_SHUFFLE, .buffer = 200, .seed = 4}, {.kind = HIN_BATCH, .batch = BS}}, 2);
    struct hin_pipe *p = open_pipe(&s, 1, 2), *q = open_pipe(&s, 1, 2);
    epoch_rows(p, &s, 1, 2, 0, a);
    epoch_rows(p, &s, 1, 2, 1, b);
    epoch_rows(q, &s, 1, 2, 0, c); /* another pipeline over the same spec: the same order */
    size_t n = hin_batches(&s, 1, 2) * BS;
    cr_assert(memcmp(a, b, n * sizeof *a) != 0, "epochs 0 and 1 in the same order");
    cr_assert(memcmp(a, c, n * sizeof *a) == 0, "the same (seed, epoch) gave another order");
    hin_close(p);
    hin_close(q);

    /* cache after the shuffle: epoch 0's order every epoch */
    s = spec((struct hin_op[]){{.kind = HIN_SHUFFLE, .buffer = 200, .seed = 4},
                               {.kind = HIN_CACHE},
                               {.kind = HIN_BATCH, .batch = BS}},
             3);
    p = open_pipe(&s, 1, 2);
    epoch_rows(p, &s, 1, 2, 0, b);
    epoch_rows(p, &s, 1, 2, 3, c);
    cr_assert(memcmp(a, b, n * sizeof *a) == 0, "the cache changed epoch 0's order");
    cr_assert(memcmp(b, c, n * sizeof *a) == 0, "a cache after the shuffle must freeze its order");
    hin_close(p);

    /* cache before the shuffle: reshuffled each epoch, the same orders as without a cache */
    s = spec((struct hin_op[]){{.kind = HIN_CACHE},
                               {.kind = HIN_SHUFFLE, .buffer = 200, .seed = 4},
                               {.kind = HIN_BATCH, .batch = BS}},
             3);
    p = open_pipe(&s, 1, 2);
    epoch_rows(p, &s, 1, 2, 1, c);
    cr_assert(memcmp(a, c, n * sizeof *a) != 0);
    epoch_rows(p, &s, 1, 2, 0, c);
    cr_assert(memcmp(a, c, n * sizeof *a) == 0);
    hin_close(p);
}

Test(hostin, a_shuffle_after_batch_moves_whole_batches)
{
    struct hin_spec s = spec(
        (struct hin_op[]){{.kind = HIN_BATCH, .batch = BS}, {.kind = HIN_SHUFFLE, .buffer = 8, .seed = 9}}, 2);
    struct hin_pipe *p = open_pipe(&s, 0, 1);
    static int order[ROWS];
    int moved = 0;
    epoch_rows(p, &s, 0, 1, 0, order);
    for (uint64_t k = 0; k < hin_batches(&s, 0, 1); k++) {
        int first = order[k * BS];
        cr_assert_eq(first % BS, 0, "batch %llu starts at row %d", (unsigned long long)k, first);
        for (int r = 1; r < BS; r++)
            cr_assert_eq(order[k * BS + r], first + r);
        moved += first != (int)k * BS;
    }
    cr_assert_gt(moved, 0);
    hin_close(p);
}

Test(hostin, prefetch_and_random_access_give_the_same_batches)
{
    struct hin_op ops[] = {{.kind = HIN_MAP_SCALE, .a = 0.5f},
                           {.kind = HIN_SHUFFLE, .buffer = 50, .seed = 1},
                           {.kind = HIN_BATCH, .batch = BS},
                           {.kind = HIN_PREFETCH, .depth = 3}};
    struct hin_spec s = spec(ops, 4), plain = spec(ops, 3);
    struct hin_pipe *p = open_pipe(&s, 2, 4), *q = open_pipe(&plain, 2, 4);
    /* in order, backwards, across epochs */
    uint64_t at[][2] = {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1}, {0, 20}, {0, 4}, {1, 2}, {2, 24}, {0, 0}};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        float x[BS * DIM], x2[BS * DIM];
        int32_t y[BS], y2[BS];
        err e;
        cr_assert_eq(hin_fill(p, at[i][0], at[i][1], x, y, &e), CODE_OK, "%s", e.msg);
        cr_assert_eq(hin_fill(q, at[i][0], at[i][1], x2, y2, &e), CODE_OK, "%s", e.msg);
        cr_assert(memcmp(x, x2, sizeof x) == 0 && memcmp(y, y2, sizeof y) == 0, "epoch %llu batch %llu",
                  (unsigned long long)at[i][0], (unsigned long long)at[i][1]);
    }
    hin_close(p);
    hin_close(q);
}

Test(hostin, maps_compute_what_they_say)
{
    struct hin_spec s = spec((struct hin_op[]){{.kind = HIN_MAP_SCALE, .a = 1 / 255.0f},
                                               {.kind = HIN_MAP_NORMALIZE, .a = 0.5f, .b = 0.25f},
                                               {.kind = HIN_MAP_SHIFT, .a = 1.0f},
                                               {.kind = HIN_BATCH, .batch = BS}},
                             4);
    struct hin_pipe *p = open_pipe(&s, 0, 1);
    float x[BS * DIM];
    int32_t y[BS];
    err e;
    cr_assert_eq(hin_fill(p, 0, 0, x, y, &e), CODE_OK, "%s", e.msg);
    for (int d = 2; d < DIM; d++) {
        float v = (float)(d + 5) * (1 / 255.0f);
        v = (v - 0.5f) / 0.25f;
        v = v + 1.0f;
        cr_assert(memcmp(&x[d], &v, sizeof v) == 0, "pixel %d: %.9g, expected %.9g", d, (double)x[d], (double)v);
    }
    hin_close(p);
}

Test(hostin, bad_specs_and_files_are_named)
{
    struct {
        struct hin_op ops[3];
        size_t n;
        const char *expect;
    } bad[] = {
        {{{.kind = HIN_CACHE}}, 1, "no batch()"},
        {{{.kind = HIN_BATCH, .batch = BS}, {.kind = HIN_MAP_SCALE, .a = 2}}, 2, "after batch()"},
        {{{.kind = HIN_BATCH, .batch = BS}, {.kind = HIN_BATCH, .batch = BS}}, 2, "a second batch()"},
        {{{.kind = HIN_PREFETCH, .depth = 1}, {.kind = HIN_BATCH, .batch = BS}}, 2, "must be the last"},
        {{{.kind = HIN_MAP_NORMALIZE, .a = 1, .b = 0}, {.kind = HIN_BATCH, .batch = BS}}, 2, "zero deviation"},
        {{{.kind = HIN_MAP_SCALE, .a = INFINITY}, {.kind = HIN_BATCH, .batch = BS}}, 2, "not a finite number"},
        {{{.kind = HIN_SHUFFLE, .buffer = 1}, {.kind = HIN_SHUFFLE, .buffer = 1}, {.kind = HIN_BATCH, .batch = BS}},
         3,
         "a second shuffle before"},
        {{{.kind = HIN_BATCH, .batch = 0}}, 1, "has 0 rows"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct hin_spec s = spec(bad[i].ops, bad[i].n);
        struct hin_pipe *p;
        err e;
        cr_assert_neq(hin_spec_check(&s, &e), CODE_OK, "case %zu", i);
        cr_assert(strstr(e.msg, bad[i].expect), "case %zu: %s", i, e.msg);
        cr_assert_eq(hin_open(&s, 0, 1, &p, &e), CODE_INVALID_ARGUMENT);
        cr_assert_null(p);
    }
    /* files: missing, the labels given as images (rank 1), another row count than the spec's */
    struct hin_spec s = spec((struct hin_op[]){{.kind = HIN_BATCH, .batch = BS}}, 1);
    struct hin_pipe *p;
    err e;
    struct hin_spec m = s;
    snprintf(m.images, sizeof m.images, "%s/none", dir);
    cr_assert_eq(hin_open(&m, 0, 1, &p, &e), CODE_NOT_FOUND);
    cr_assert(strstr(e.msg, m.images), "%s", e.msg);
    m = s;
    m.rows = ROWS + 1;
    cr_assert_eq(hin_open(&m, 0, 1, &p, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "the spec says 1004"), "%s", e.msg);
    m = s;
    snprintf(m.labels, sizeof m.labels, "%s", img);
    cr_assert_eq(hin_open(&m, 0, 1, &p, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "rank 2") && strstr(e.msg, img), "%s", e.msg);
    cr_assert_eq(hin_open(&s, 3, 3, &p, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "does not exist"), "%s", e.msg);
}
