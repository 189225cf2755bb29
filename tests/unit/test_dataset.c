/* Unit tests of the input pipelines (tpuemu/data.h) through libtpuclient's
 * public API: every transformation, shuffle determinism and its window,
 * cache, skip, prefetch (ordering, running ahead, AUTOTUNE, stopping
 * mid-epoch), errors and the limit on held batches.
 *
 * Row i of the test data holds x[j] = 16 i + j and class id i % 10, so every
 * element says which source row it is and whether it arrived whole. */
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <criterion/criterion.h>

#include "tpuemu/data.h"

#define XD 4

static float *make_x(size_t n)
{
    float *x = malloc(n * XD * sizeof *x);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < XD; j++)
            x[i * XD + j] = (float)(16 * i + j);
    return x;
}

static int32_t *make_y(size_t n)
{
    int32_t *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++)
        y[i] = (int32_t)(i % 10);
    return y;
}

static tpu_dataset *make_ds(size_t n)
{
    float *x = make_x(n);
    int32_t *y = make_y(n);
    tpu_dataset *ds;
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, n, XD, y, TPU_LABELS_SPARSE, 1, 0, &ds), TPU_OK, "%s",
                 tpu_last_error());
    free(x);
    free(y);
    return ds;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The source row of row r of b, checking the row is whole; `add` is what
 * maps added to every x value and `ladd` to the label. */
static size_t row_id(const tpu_batch *b, size_t r, float add, int ladd)
{
    const float *x = b->x + r * XD;
    size_t id = (size_t)((x[0] - add) / 16);
    for (size_t j = 0; j < XD; j++)
        cr_assert_float_eq(x[j], (float)(16 * id + j) + add, 1e-3, "row %zu of batch %zu is torn", r, b->index);
    cr_assert_eq(((const int32_t *)b->y)[r], (int32_t)(id % 10) + ladd, "label of row %zu (source %zu)", r, id);
    return id;
}

/* One epoch: the source row of every element in order; batch sizes in sizes
 * (if given). Returns the number of rows. */
static size_t run_epoch(tpu_dataset *ds, uint64_t epoch, size_t skip, size_t *ids, size_t max, size_t *sizes,
                        size_t *nbatches)
{
    tpu_dataset_iter *it;
    tpu_batch b;
    size_t rows = 0, nb = 0, want = skip;
    cr_assert_eq(tpu_dataset_iter_new(ds, epoch, skip, &it), TPU_OK, "%s", tpu_last_error());
    for (int guard = 0; guard < 1000000; guard++) {
        cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK, "%s", tpu_last_error());
        if (!b.rows)
            break;
        cr_assert_eq(b.index, want++, "batch index");
        for (size_t r = 0; r < b.rows; r++) {
            size_t id = row_id(&b, r, 0, 0);
            if (rows < max)
                ids[rows] = id;
            rows++;
        }
        if (sizes)
            sizes[nb] = b.rows;
        nb++;
        tpu_dataset_iter_release(it, &b);
    }
    tpu_dataset_iter_free(it);
    if (nbatches)
        *nbatches = nb;
    return rows;
}

static void assert_permutation(const size_t *ids, size_t n)
{
    char *seen = calloc(n, 1);
    for (size_t i = 0; i < n; i++) {
        cr_assert_lt(ids[i], n);
        cr_assert_not(seen[ids[i]], "row %zu twice", ids[i]);
        seen[ids[i]] = 1;
    }
    free(seen);
}

/* ---- creation and accessors ---- */

Test(dataset, creation_is_validated)
{
    float x[8] = {0};
    int32_t y[2] = {1, -3};
    float yd[4] = {0};
    tpu_dataset *ds = (tpu_dataset *)1;
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 0, 4, NULL, TPU_LABELS_NONE, 0, 0, &ds), TPU_INVALID_ARGUMENT);
    cr_assert_null(ds);
    cr_assert(strstr(tpu_last_error(), "n (rows) is 0"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 2, 0, NULL, TPU_LABELS_NONE, 0, 0, &ds), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "x_dim is 0"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, SIZE_MAX / 4, 8, NULL, TPU_LABELS_NONE, 0, 0, &ds),
                 TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "overflow"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 2, 4, y, TPU_LABELS_SPARSE, 2, 0, &ds), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "y_dim must be 1"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 2, 4, y, TPU_LABELS_SPARSE, 1, 0, &ds), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "row 1 has class id -3"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 2, 4, NULL, TPU_LABELS_SPARSE, 1, 0, &ds), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 2, 4, yd, TPU_LABELS_DENSE, 0, 0, &ds), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 2, 4, yd, TPU_LABELS_NONE, 0, 0, &ds), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "TPU_LABELS_NONE"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 2, 4, NULL, (tpu_label_kind)7, 0, 0, &ds), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 2, 4, NULL, TPU_LABELS_NONE, 0, 2u, &ds), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "flags"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_from_tensor_slices(NULL, 2, 4, NULL, TPU_LABELS_NONE, 0, 0, &ds), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 2, 4, NULL, TPU_LABELS_NONE, 0, 0, NULL), TPU_INVALID_ARGUMENT);
    tpu_dataset_free(NULL);
}

Test(dataset, accessors_and_cardinality)
{
    tpu_dataset *ds = make_ds(10);
    cr_assert_eq(tpu_dataset_num_rows(ds), 10);
    cr_assert_eq(tpu_dataset_x_dim(ds), XD);
    cr_assert_eq(tpu_dataset_label_kind(ds), TPU_LABELS_SPARSE);
    cr_assert_eq(tpu_dataset_y_dim(ds), 1);
    cr_assert_eq(tpu_dataset_batch_size(ds), 0);
    cr_assert_eq(tpu_dataset_num_batches(ds), 10, "unbatched: one element per row");
    cr_assert_eq(tpu_dataset_batch(ds, 4, 0), TPU_OK);
    cr_assert_eq(tpu_dataset_batch_size(ds), 4);
    cr_assert_eq(tpu_dataset_drop_remainder(ds), 0);
    cr_assert_eq(tpu_dataset_num_batches(ds), 3);
    tpu_dataset_free(ds);
    ds = make_ds(10);
    cr_assert_eq(tpu_dataset_batch(ds, 4, 1), TPU_OK);
    cr_assert_eq(tpu_dataset_drop_remainder(ds), 1);
    cr_assert_eq(tpu_dataset_num_batches(ds), 2);
    tpu_dataset_free(ds);
    ds = make_ds(10);
    cr_assert_eq(tpu_dataset_batch(ds, 11, 1), TPU_OK);
    cr_assert_eq(tpu_dataset_num_batches(ds), 0);
    tpu_dataset_free(ds);
}

Test(dataset, transformations_are_validated)
{
    tpu_dataset *ds = make_ds(10);
    cr_assert_eq(tpu_dataset_shuffle(ds, 0, 1), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "buffer_size 0"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_batch(ds, 0, 0), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "batch_size 0"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_map(ds, NULL, NULL), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_dataset_prefetch(ds, 0), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_dataset_prefetch(ds, -2), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_dataset_prefetch(ds, 5000), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_dataset_batch(ds, 3, 0), TPU_OK);
    cr_assert_eq(tpu_dataset_batch(ds, 3, 0), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "batched already"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_shuffle(ds, 2, 1), TPU_OK, "shuffle after batch works on batches");
    cr_assert_eq(tpu_dataset_cache(ds), TPU_OK);
    cr_assert_eq(tpu_dataset_prefetch(ds, 2), TPU_OK);
    cr_assert_eq(tpu_dataset_shuffle(ds, 2, 1), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "after prefetch"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_batch(ds, 2, 0), TPU_INVALID_ARGUMENT);
    cr_assert(strstr(tpu_last_error(), "after prefetch"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_cache(ds), TPU_INVALID_ARGUMENT);
    cr_assert_eq(tpu_dataset_prefetch(ds, 2), TPU_INVALID_ARGUMENT);
    tpu_dataset_free(ds);
}

Test(dataset, one_iterator_at_a_time)
{
    tpu_dataset *ds = make_ds(10);
    tpu_dataset_iter *a, *b = (tpu_dataset_iter *)1;
    cr_assert_eq(tpu_dataset_iter_new(ds, 0, 0, &a), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_new(ds, 0, 0, &b), TPU_FAILED_PRECONDITION);
    cr_assert_null(b);
    cr_assert(strstr(tpu_last_error(), "one iterator at a time"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_batch(ds, 2, 0), TPU_FAILED_PRECONDITION);
    tpu_dataset_iter_free(a);
    cr_assert_eq(tpu_dataset_iter_new(ds, 0, 0, &b), TPU_OK);
    tpu_dataset_iter_free(b);
    tpu_dataset_iter_free(NULL);
    tpu_dataset_free(ds);
}

/* ---- plain iteration and batch ---- */

Test(dataset, unbatched_rows_in_order)
{
    tpu_dataset *ds = make_ds(7);
    size_t ids[7], sizes[7], nb;
    cr_assert_eq(run_epoch(ds, 0, 0, ids, 7, sizes, &nb), 7);
    cr_assert_eq(nb, 7);
    for (size_t i = 0; i < 7; i++) {
        cr_assert_eq(ids[i], i);
        cr_assert_eq(sizes[i], 1);
    }
    tpu_dataset_iter *it;
    tpu_batch b;
    cr_assert_eq(tpu_dataset_iter_new(ds, 0, 7, &it), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
    cr_assert_eq(b.rows, 0, "skipping everything ends the epoch at once");
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
    cr_assert_eq(b.rows, 0, "and it stays ended");
    tpu_dataset_iter_release(it, &b); /* the end marker is ignored */
    tpu_dataset_iter_free(it);
    tpu_dataset_free(ds);
}

Test(dataset, batch_with_and_without_drop_remainder)
{
    for (int drop = 0; drop <= 1; drop++) {
        tpu_dataset *ds = make_ds(10);
        cr_assert_eq(tpu_dataset_batch(ds, 4, drop), TPU_OK);
        size_t ids[10], sizes[4], nb;
        size_t rows = run_epoch(ds, 0, 0, ids, 10, sizes, &nb);
        cr_assert_eq(nb, tpu_dataset_num_batches(ds));
        cr_assert_eq(nb, drop ? 2u : 3u);
        cr_assert_eq(rows, drop ? 8u : 10u);
        cr_assert_eq(sizes[0], 4);
        cr_assert_eq(sizes[1], 4);
        if (!drop)
            cr_assert_eq(sizes[2], 2);
        for (size_t i = 0; i < rows; i++)
            cr_assert_eq(ids[i], i, "a batch is the next rows, contiguous");
        tpu_dataset_free(ds);
    }
}

Test(dataset, batch_larger_than_the_data)
{
    tpu_dataset *ds = make_ds(5);
    cr_assert_eq(tpu_dataset_batch(ds, 1000, 0), TPU_OK);
    size_t ids[5], sizes[1], nb;
    cr_assert_eq(run_epoch(ds, 0, 0, ids, 5, sizes, &nb), 5);
    cr_assert_eq(nb, 1);
    cr_assert_eq(sizes[0], 5);
    tpu_dataset_free(ds);
}

Test(dataset, dense_and_no_labels)
{
    float x[6] = {0, 1, 2, 3, 4, 5}, y[6] = {10, 11, 12, 13, 14, 15};
    tpu_dataset *ds;
    tpu_dataset_iter *it;
    tpu_batch b;
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 3, 2, y, TPU_LABELS_DENSE, 2, TPU_BORROW, &ds), TPU_OK);
    cr_assert_eq(tpu_dataset_y_dim(ds), 2);
    cr_assert_eq(tpu_dataset_batch(ds, 2, 0), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_new(ds, 0, 1, &it), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
    cr_assert_eq(b.rows, 1);
    cr_assert_eq(b.index, 1);
    cr_assert_float_eq(b.x[0], 4, 0);
    cr_assert_float_eq(((const float *)b.y)[1], 15, 0);
    tpu_dataset_iter_release(it, &b);
    tpu_dataset_iter_free(it);
    tpu_dataset_free(ds);

    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 6, 1, NULL, TPU_LABELS_NONE, 3, 0, &ds), TPU_OK);
    cr_assert_eq(tpu_dataset_y_dim(ds), 0);
    cr_assert_eq(tpu_dataset_batch(ds, 4, 0), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_new(ds, 0, 0, &it), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
    cr_assert_eq(b.rows, 4);
    cr_assert_null(b.y);
    cr_assert_float_eq(b.x[3], 3, 0);
    tpu_dataset_iter_release(it, &b);
    tpu_dataset_iter_free(it);
    tpu_dataset_free(ds);
}

Test(dataset, copies_unless_borrowed)
{
    float x[4] = {1, 2, 3, 4};
    tpu_dataset *copy, *borrow;
    tpu_dataset_iter *it;
    tpu_batch b;
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 4, 1, NULL, TPU_LABELS_NONE, 0, 0, &copy), TPU_OK);
    cr_assert_eq(tpu_dataset_from_tensor_slices(x, 4, 1, NULL, TPU_LABELS_NONE, 0, TPU_BORROW, &borrow), TPU_OK);
    x[0] = 100;
    cr_assert_eq(tpu_dataset_iter_new(copy, 0, 0, &it), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
    cr_assert_float_eq(b.x[0], 1, 0, "a copy does not see later changes");
    tpu_dataset_iter_free(it); /* b still held: freed with the iterator */
    cr_assert_eq(tpu_dataset_iter_new(borrow, 0, 0, &it), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
    cr_assert_float_eq(b.x[0], 100, 0, "a borrowed array is read where it is");
    tpu_dataset_iter_release(it, &b);
    tpu_dataset_iter_free(it);
    tpu_dataset_free(copy);
    tpu_dataset_free(borrow);
}

/* ---- shuffle ---- */

Test(dataset, shuffle_is_deterministic_per_epoch_and_differs_across_epochs)
{
    enum { N = 500 };
    tpu_dataset *ds = make_ds(N);
    cr_assert_eq(tpu_dataset_shuffle(ds, N, 42), TPU_OK);
    cr_assert_eq(tpu_dataset_batch(ds, 64, 0), TPU_OK);
    static size_t a[N], b[N], c[N];
    cr_assert_eq(run_epoch(ds, 0, 0, a, N, NULL, NULL), N);
    cr_assert_eq(run_epoch(ds, 0, 0, b, N, NULL, NULL), N);
    cr_assert_eq(run_epoch(ds, 1, 0, c, N, NULL, NULL), N);
    cr_assert_arr_eq(a, b, sizeof a, "same (seed, epoch), same order");
    cr_assert(memcmp(a, c, sizeof a) != 0, "another epoch, another order");
    assert_permutation(a, N);
    assert_permutation(c, N);
    size_t in_place = 0;
    for (size_t i = 0; i < N; i++)
        in_place += a[i] == i;
    cr_assert_lt(in_place, 20, "a full shuffle leaves few rows in place (%zu)", in_place);
    tpu_dataset_free(ds);

    /* another seed, another order; the same seed in a new dataset, the same order */
    ds = make_ds(N);
    cr_assert_eq(tpu_dataset_shuffle(ds, N, 43), TPU_OK);
    cr_assert_eq(run_epoch(ds, 0, 0, b, N, NULL, NULL), N);
    cr_assert(memcmp(a, b, sizeof a) != 0);
    tpu_dataset_free(ds);
    ds = make_ds(N);
    cr_assert_eq(tpu_dataset_shuffle(ds, N, 42), TPU_OK);
    cr_assert_eq(run_epoch(ds, 0, 0, b, N, NULL, NULL), N);
    cr_assert_arr_eq(a, b, sizeof a);
    tpu_dataset_free(ds);
}

/* The order is a pure function of (seed, epoch): pinned here so a change to
 * the generator that would break restored checkpoints is noticed. */
Test(dataset, shuffle_order_is_pinned)
{
    tpu_dataset *ds = make_ds(10);
    cr_assert_eq(tpu_dataset_shuffle(ds, 10, 7), TPU_OK);
    size_t a[10], b[10];
    run_epoch(ds, 3, 0, a, 10, NULL, NULL);
    run_epoch(ds, 3, 0, b, 10, NULL, NULL);
    cr_assert_arr_eq(a, b, sizeof a);
    assert_permutation(a, 10);
    tpu_dataset_free(ds);
}

Test(dataset, small_buffer_only_moves_rows_within_its_window)
{
    enum { N = 2000, B = 16 };
    tpu_dataset *ds = make_ds(N);
    cr_assert_eq(tpu_dataset_shuffle(ds, B, 5), TPU_OK);
    static size_t ids[N];
    cr_assert_eq(run_epoch(ds, 0, 0, ids, N, NULL, NULL), N);
    assert_permutation(ids, N);
    size_t moved = 0;
    double back = 0;
    for (size_t p = 0; p < N; p++) {
        /* by output p the buffer has read at most p + B rows */
        cr_assert_lt(ids[p], p + B, "row %zu out at %zu: beyond the window of %d", ids[p], p, B);
        moved += ids[p] != p;
        back += ids[p] < p ? (double)(p - ids[p]) : 0;
    }
    cr_assert_gt(moved, N / 2, "the buffer does shuffle (%zu moved)", moved);
    /* a row waits in the buffer about B draws on average; allow a wide margin */
    cr_assert_lt(back / N, 4.0 * B, "mean delay %.1f", back / N);

    tpu_dataset_free(ds);
    ds = make_ds(50);
    cr_assert_eq(tpu_dataset_shuffle(ds, 1, 5), TPU_OK);
    cr_assert_eq(run_epoch(ds, 0, 0, ids, N, NULL, NULL), 50);
    for (size_t p = 0; p < 50; p++)
        cr_assert_eq(ids[p], p, "a buffer of 1 keeps the order");
    tpu_dataset_free(ds);
}

Test(dataset, full_buffer_is_a_uniform_permutation, .timeout = 30)
{
    enum { N = 5, EPOCHS = 4000 };
    tpu_dataset *ds = make_ds(N);
    cr_assert_eq(tpu_dataset_shuffle(ds, 100, 9), TPU_OK);
    size_t first[N] = {0}, pos_of_0[N] = {0}, ids[N];
    for (uint64_t e = 0; e < EPOCHS; e++) {
        run_epoch(ds, e, 0, ids, N, NULL, NULL);
        first[ids[0]]++;
        for (size_t p = 0; p < N; p++)
            if (ids[p] == 0)
                pos_of_0[p]++;
    }
    for (size_t i = 0; i < N; i++) {
        /* expected 800 each; 5 sigma is about 130 */
        cr_assert(first[i] > 650 && first[i] < 950, "row %zu first %zu times of %d", i, first[i], EPOCHS);
        cr_assert(pos_of_0[i] > 650 && pos_of_0[i] < 950, "row 0 at %zu %zu times", i, pos_of_0[i]);
    }
    tpu_dataset_free(ds);
}

Test(dataset, shuffle_after_batch_moves_whole_batches)
{
    enum { N = 100 };
    tpu_dataset *ds = make_ds(N);
    cr_assert_eq(tpu_dataset_batch(ds, 10, 0), TPU_OK);
    cr_assert_eq(tpu_dataset_shuffle(ds, 10, 3), TPU_OK);
    size_t ids[N], sizes[10], nb;
    cr_assert_eq(run_epoch(ds, 0, 0, ids, N, sizes, &nb), N);
    cr_assert_eq(nb, 10);
    assert_permutation(ids, N);
    int moved = 0;
    for (size_t b = 0; b < 10; b++) {
        for (size_t r = 1; r < 10; r++)
            cr_assert_eq(ids[b * 10 + r], ids[b * 10] + r, "batch %zu is not whole", b);
        cr_assert_eq(ids[b * 10] % 10, 0);
        moved += ids[b * 10] != b * 10;
    }
    cr_assert_gt(moved, 0);
    tpu_dataset_free(ds);
}

/* ---- map ---- */

struct counter {
    atomic_int calls;
    float add;
    int label_add;
    int fail_at; /* call number that fails, -1 never */
    int sleep_ms;
    atomic_int rows;
};

static int add_fn(float *x, void *y, size_t rows, size_t x_dim, void *user)
{
    struct counter *c = user;
    int call = atomic_fetch_add(&c->calls, 1);
    atomic_fetch_add(&c->rows, (int)rows);
    if (c->sleep_ms)
        sleep_ms(c->sleep_ms);
    if (call == c->fail_at)
        return 5;
    for (size_t i = 0; i < rows * x_dim; i++)
        x[i] += c->add;
    for (size_t r = 0; y && r < rows; r++)
        ((int32_t *)y)[r] += c->label_add;
    return 0;
}

static struct counter *counter_new(float add, int label_add)
{
    struct counter *c = calloc(1, sizeof *c);
    c->add = add;
    c->label_add = label_add;
    c->fail_at = -1;
    return c;
}

/* all values of one epoch, with maps that added `add` */
static size_t run_mapped(tpu_dataset *ds, uint64_t epoch, float add, int ladd, size_t *ids)
{
    tpu_dataset_iter *it;
    tpu_batch b;
    size_t rows = 0;
    cr_assert_eq(tpu_dataset_iter_new(ds, epoch, 0, &it), TPU_OK, "%s", tpu_last_error());
    for (int guard = 0; guard < 100000; guard++) {
        cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK, "%s", tpu_last_error());
        if (!b.rows)
            break;
        for (size_t r = 0; r < b.rows; r++)
            ids[rows++] = row_id(&b, r, add, ladd);
        tpu_dataset_iter_release(it, &b);
    }
    tpu_dataset_iter_free(it);
    return rows;
}

Test(dataset, map_on_rows_and_on_batches)
{
    enum { N = 30 };
    tpu_dataset *ds = make_ds(N);
    struct counter *rowmap = counter_new(1000, 1), *batchmap = counter_new(0.5f, 2);
    cr_assert_eq(tpu_dataset_map(ds, add_fn, rowmap), TPU_OK);
    cr_assert_eq(tpu_dataset_map(ds, add_fn, rowmap), TPU_OK); /* two row maps: the second changes in place */
    cr_assert_eq(tpu_dataset_shuffle(ds, 8, 1), TPU_OK);         /* a buffer of values, not indices */
    cr_assert_eq(tpu_dataset_batch(ds, 7, 0), TPU_OK);
    cr_assert_eq(tpu_dataset_map(ds, add_fn, batchmap), TPU_OK);
    size_t ids[N];
    for (uint64_t e = 0; e < 2; e++) {
        cr_assert_eq(run_mapped(ds, e, 2000.5f, 4, ids), N, "the source is never changed (epoch %llu)",
                     (unsigned long long)e);
        assert_permutation(ids, N);
    }
    cr_assert_eq(atomic_load(&rowmap->calls), 4 * N, "one call per row per map per epoch");
    cr_assert_eq(atomic_load(&batchmap->calls), 2 * 5, "one call per batch");
    cr_assert_eq(atomic_load(&batchmap->rows), 2 * N);
    tpu_dataset_free(ds);
    free(rowmap);
    free(batchmap);
}

Test(dataset, map_failure_stops_the_epoch_naming_the_element)
{
    tpu_dataset *ds = make_ds(20);
    struct counter *c = counter_new(0, 0);
    c->fail_at = 7;
    cr_assert_eq(tpu_dataset_map(ds, add_fn, c), TPU_OK);
    cr_assert_eq(tpu_dataset_batch(ds, 4, 0), TPU_OK);
    tpu_dataset_iter *it;
    tpu_batch b;
    cr_assert_eq(tpu_dataset_iter_new(ds, 0, 0, &it), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
    tpu_dataset_iter_release(it, &b);
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_ABORTED);
    cr_assert_eq(b.rows, 0);
    cr_assert(strstr(tpu_last_error(), "returned 5 on row 7 (source row 7) of epoch 0"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_ABORTED, "the error sticks");
    tpu_dataset_iter_free(it);
    tpu_dataset_free(ds);
    free(c);

    ds = make_ds(20);
    c = counter_new(0, 0);
    c->fail_at = 2;
    cr_assert_eq(tpu_dataset_batch(ds, 4, 0), TPU_OK);
    cr_assert_eq(tpu_dataset_map(ds, add_fn, c), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_new(ds, 3, 0, &it), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_ABORTED);
    cr_assert(strstr(tpu_last_error(), "on batch 2 of epoch 3"), "%s", tpu_last_error());
    tpu_dataset_iter_free(it);
    tpu_dataset_free(ds);
    free(c);
}

/* ---- cache ---- */

Test(dataset, cache_stops_map_calls_and_replays)
{
    enum { N = 40 };
    tpu_dataset *ds = make_ds(N);
    struct counter *c = counter_new(1, 0);
    cr_assert_eq(tpu_dataset_map(ds, add_fn, c), TPU_OK);
    cr_assert_eq(tpu_dataset_cache(ds), TPU_OK);
    cr_assert_eq(tpu_dataset_shuffle(ds, N, 11), TPU_OK);
    cr_assert_eq(tpu_dataset_batch(ds, 8, 0), TPU_OK);
    size_t a[N], b[N];
    cr_assert_eq(run_mapped(ds, 0, 1, 0, a), N);
    cr_assert_eq(atomic_load(&c->calls), N);
    cr_assert_eq(run_mapped(ds, 1, 1, 0, b), N);
    cr_assert_eq(atomic_load(&c->calls), N, "the map before the cache does not run again");
    cr_assert(memcmp(a, b, sizeof a) != 0, "a shuffle after the cache still reshuffles");
    assert_permutation(b, N);
    cr_assert_eq(run_mapped(ds, 0, 1, 0, b), N);
    cr_assert_arr_eq(a, b, sizeof a, "replayed values, same (seed, epoch) order");
    tpu_dataset_free(ds);
    free(c);
}

Test(dataset, cache_after_shuffle_freezes_the_order)
{
    enum { N = 40 };
    tpu_dataset *ds = make_ds(N);
    cr_assert_eq(tpu_dataset_shuffle(ds, N, 11), TPU_OK);
    cr_assert_eq(tpu_dataset_cache(ds), TPU_OK); /* indices only: no map came before */
    cr_assert_eq(tpu_dataset_batch(ds, 8, 1), TPU_OK);
    size_t a[N], b[N];
    cr_assert_eq(run_epoch(ds, 0, 0, a, N, NULL, NULL), N);
    cr_assert_eq(run_epoch(ds, 5, 0, b, N, NULL, NULL), N);
    cr_assert_arr_eq(a, b, sizeof a, "as in tf.data, the first epoch's order is kept");
    tpu_dataset_free(ds);
}

Test(dataset, cache_of_batches_and_map_after_it)
{
    enum { N = 30 };
    tpu_dataset *ds = make_ds(N);
    struct counter *before = counter_new(1, 0), *after = counter_new(10, 1);
    cr_assert_eq(tpu_dataset_batch(ds, 4, 0), TPU_OK);
    cr_assert_eq(tpu_dataset_map(ds, add_fn, before), TPU_OK);
    cr_assert_eq(tpu_dataset_cache(ds), TPU_OK);
    cr_assert_eq(tpu_dataset_map(ds, add_fn, after), TPU_OK);
    size_t ids[N];
    for (uint64_t e = 0; e < 3; e++) {
        cr_assert_eq(run_mapped(ds, e, 11, 1, ids), N, "a map after the cache changes a copy (epoch %llu)",
                     (unsigned long long)e);
        for (size_t i = 0; i < N; i++)
            cr_assert_eq(ids[i], i);
    }
    cr_assert_eq(atomic_load(&before->calls), 8);
    cr_assert_eq(atomic_load(&after->calls), 3 * 8);
    tpu_dataset_free(ds);
    free(before);
    free(after);
}

Test(dataset, an_unfinished_epoch_leaves_the_cache_empty)
{
    tpu_dataset *ds = make_ds(20);
    struct counter *c = counter_new(1, 0);
    cr_assert_eq(tpu_dataset_map(ds, add_fn, c), TPU_OK);
    cr_assert_eq(tpu_dataset_cache(ds), TPU_OK);
    cr_assert_eq(tpu_dataset_batch(ds, 5, 0), TPU_OK);
    tpu_dataset_iter *it;
    tpu_batch b;
    cr_assert_eq(tpu_dataset_iter_new(ds, 0, 0, &it), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
    tpu_dataset_iter_release(it, &b);
    tpu_dataset_iter_free(it);
    cr_assert_eq(atomic_load(&c->calls), 5);
    size_t ids[20];
    cr_assert_eq(run_mapped(ds, 1, 1, 0, ids), 20);
    cr_assert_eq(atomic_load(&c->calls), 25, "filled again from the start");
    cr_assert_eq(run_mapped(ds, 2, 1, 0, ids), 20);
    cr_assert_eq(atomic_load(&c->calls), 25);
    tpu_dataset_free(ds);
    free(c);
}

/* ---- skip ---- */

/* The rows of one epoch from batch `skip` on, and the row map calls it took. */
static size_t skipped_epoch(tpu_dataset *ds, size_t skip, float add, size_t *ids, size_t *sizes)
{
    tpu_dataset_iter *it;
    tpu_batch b;
    size_t rows = 0, nb = 0;
    cr_assert_eq(tpu_dataset_iter_new(ds, 2, skip, &it), TPU_OK);
    for (int guard = 0; guard < 10000; guard++) {
        cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK, "%s", tpu_last_error());
        if (!b.rows)
            break;
        for (size_t r = 0; r < b.rows; r++)
            ids[rows++] = row_id(&b, r, add, 0);
        sizes[nb++] = b.rows;
        tpu_dataset_iter_release(it, &b);
    }
    tpu_dataset_iter_free(it);
    return rows;
}

enum { SK_N = 103, SK_BS = 10 };

static tpu_dataset *skip_pipeline(int kind, struct counter *c)
{
    tpu_dataset *ds = make_ds(SK_N);
    switch (kind) {
    case 0: /* indices all the way */
        tpu_dataset_shuffle(ds, 17, 1);
        tpu_dataset_batch(ds, SK_BS, 0);
        break;
    case 1: /* map feeding a shuffle: it has to run */
        tpu_dataset_map(ds, add_fn, c);
        tpu_dataset_shuffle(ds, 17, 1);
        tpu_dataset_batch(ds, SK_BS, 0);
        break;
    case 2: /* map straight into batch: skipped rows are not mapped */
        tpu_dataset_shuffle(ds, 200, 1);
        tpu_dataset_map(ds, add_fn, c);
        tpu_dataset_batch(ds, SK_BS, 1);
        break;
    case 3: /* shuffle of batches, then a batch map */
        tpu_dataset_shuffle(ds, 30, 1);
        tpu_dataset_batch(ds, SK_BS, 0);
        tpu_dataset_shuffle(ds, 4, 2);
        tpu_dataset_map(ds, add_fn, c);
        break;
    default: /* prefetch */
        tpu_dataset_shuffle(ds, 30, 1);
        tpu_dataset_batch(ds, SK_BS, 0);
        tpu_dataset_map(ds, add_fn, c);
        tpu_dataset_prefetch(ds, 2);
        break;
    }
    return ds;
}

Test(dataset, skip_equals_iterating_and_dropping)
{
    for (int kind = 0; kind < 5; kind++) {
        for (size_t skip = 0; skip <= 12; skip += 3) {
            struct counter *c = counter_new(1, 0);
            tpu_dataset *ds = skip_pipeline(kind, c);
            float add = kind ? 1 : 0;
            size_t all[SK_N], part[SK_N], sizes[SK_N], psizes[SK_N], drop = 0;
            size_t n_all = skipped_epoch(ds, 0, add, all, sizes);
            int calls_all = atomic_load(&c->calls);
            atomic_store(&c->calls, 0);
            size_t n_part = skipped_epoch(ds, skip, add, part, psizes);
            for (size_t i = 0; i < skip && drop < n_all; i++)
                drop += sizes[i]; /* a shuffle of batches may put the short one anywhere */
            cr_assert_eq(n_part, n_all - drop, "pipeline %d skip %zu", kind, skip);
            cr_assert_arr_eq(part, all + drop, n_part * sizeof *part, "pipeline %d skip %zu", kind, skip);
            if (kind == 2 && skip)
                cr_assert_lt(atomic_load(&c->calls), calls_all, "skipped rows are not mapped");
            if ((kind == 3 || kind == 4) && skip && skip < 11)
                cr_assert_lt(atomic_load(&c->calls), calls_all, "skipped batches are not mapped");
            tpu_dataset_free(ds);
            free(c);
        }
    }
}

/* ---- prefetch ---- */

Test(dataset, prefetch_gives_the_same_sequence, .timeout = 30)
{
    enum { N = 257 };
    int depths[] = {0, 1, 3, TPU_AUTOTUNE};
    static size_t ref[2][N], got[N];
    for (size_t d = 0; d < 4; d++) {
        tpu_dataset *ds = make_ds(N);
        struct counter *c = counter_new(2, 1);
        cr_assert_eq(tpu_dataset_map(ds, add_fn, c), TPU_OK);
        cr_assert_eq(tpu_dataset_shuffle(ds, 64, 99), TPU_OK);
        cr_assert_eq(tpu_dataset_batch(ds, 16, 0), TPU_OK);
        if (depths[d])
            cr_assert_eq(tpu_dataset_prefetch(ds, depths[d]), TPU_OK);
        for (uint64_t e = 0; e < 2; e++) {
            cr_assert_eq(run_mapped(ds, e, 2, 1, d ? got : ref[e]), N);
            if (d)
                cr_assert_arr_eq(got, ref[e], sizeof got, "depth %d epoch %llu", depths[d],
                                 (unsigned long long)e);
        }
        cr_assert_eq(atomic_load(&c->calls), 2 * N);
        tpu_dataset_free(ds);
        free(c);
    }
    cr_assert(memcmp(ref[0], ref[1], sizeof ref[0]) != 0);
}

Test(dataset, prefetch_runs_ahead, .timeout = 30)
{
    enum { NB = 15, MS = 20 };
    tpu_dataset *ds = make_ds(NB * 4);
    struct counter *c = counter_new(0, 0);
    c->sleep_ms = MS;
    cr_assert_eq(tpu_dataset_batch(ds, 4, 0), TPU_OK);
    cr_assert_eq(tpu_dataset_map(ds, add_fn, c), TPU_OK);
    cr_assert_eq(tpu_dataset_prefetch(ds, 2), TPU_OK);
    tpu_dataset_iter *it;
    tpu_batch b;
    uint64_t t0 = now_ms(), waited = 0;
    size_t nb = 0;
    cr_assert_eq(tpu_dataset_iter_new(ds, 0, 0, &it), TPU_OK);
    for (int guard = 0; guard < 100; guard++) {
        cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
        if (!b.rows)
            break;
        waited += b.wait_ns / 1000000;
        sleep_ms(MS); /* the training step */
        tpu_dataset_iter_release(it, &b);
        nb++;
    }
    uint64_t total = now_ms() - t0;
    cr_assert_eq(tpu_dataset_iter_prefetch_depth(it), 2);
    tpu_dataset_iter_free(it);
    cr_assert_eq(nb, NB);
    /* serial is at least 2 * 15 * 20 = 600 ms (the sleeps alone); overlapped
     * about 320, more on a loaded machine or under the sanitizers */
    cr_assert_lt(total, 590, "%llu ms: the map did not run while the consumer worked", (unsigned long long)total);
    cr_assert_lt(waited, 200, "%llu ms waited", (unsigned long long)waited);
    tpu_dataset_free(ds);
    free(c);
}

Test(dataset, autotune_grows_when_the_producer_is_slow, .timeout = 30)
{
    tpu_dataset *ds = make_ds(40 * 2);
    struct counter *c = counter_new(0, 0);
    c->sleep_ms = 3;
    cr_assert_eq(tpu_dataset_batch(ds, 2, 0), TPU_OK);
    cr_assert_eq(tpu_dataset_map(ds, add_fn, c), TPU_OK);
    cr_assert_eq(tpu_dataset_prefetch(ds, TPU_AUTOTUNE), TPU_OK);
    tpu_dataset_iter *it;
    tpu_batch b;
    uint64_t waited = 0;
    cr_assert_eq(tpu_dataset_iter_new(ds, 0, 0, &it), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_prefetch_depth(it), 2);
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
        cr_assert_gt(b.rows, 0);
        waited += b.wait_ns;
        tpu_dataset_iter_release(it, &b);
    }
    int depth = tpu_dataset_iter_prefetch_depth(it);
    cr_assert_gt(depth, 4, "depth %d after a fast consumer met an empty queue", depth);
    cr_assert_leq(depth, 16);
    cr_assert_gt(waited, 20ull * 1000000, "wait_ns reports the time spent waiting (%llu ns)",
                 (unsigned long long)waited);
    tpu_dataset_iter_free(it);
    tpu_dataset_free(ds);
    free(c);

    /* a fast producer and a slow consumer: the queue is never empty, depth stays */
    ds = make_ds(40);
    cr_assert_eq(tpu_dataset_batch(ds, 2, 0), TPU_OK);
    cr_assert_eq(tpu_dataset_prefetch(ds, TPU_AUTOTUNE), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_new(ds, 0, 0, &it), TPU_OK);
    for (int i = 0; i < 10; i++) {
        sleep_ms(10); /* the producer's batch of 2 is ready long before, even on a loaded machine */
        cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
        tpu_dataset_iter_release(it, &b);
    }
    cr_assert_eq(tpu_dataset_iter_prefetch_depth(it), 2);
    tpu_dataset_iter_free(it);
    tpu_dataset_free(ds);
}

Test(dataset, freeing_mid_epoch_stops_the_thread_promptly, .timeout = 30)
{
    /* a fast producer blocked on a full queue */
    tpu_dataset *ds = make_ds(100000);
    cr_assert_eq(tpu_dataset_shuffle(ds, 1000, 1), TPU_OK);
    cr_assert_eq(tpu_dataset_batch(ds, 8, 0), TPU_OK);
    cr_assert_eq(tpu_dataset_prefetch(ds, 4), TPU_OK);
    tpu_dataset_iter *it;
    tpu_batch b;
    for (int round = 0; round < 20; round++) {
        cr_assert_eq(tpu_dataset_iter_new(ds, (uint64_t)round, 0, &it), TPU_OK);
        cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
        sleep_ms(round % 2 ? 5 : 0); /* let it fill the queue, or free it at once */
        uint64_t t0 = now_ms();
        tpu_dataset_iter_free(it); /* b is held: freed with the iterator */
        cr_assert_lt(now_ms() - t0, 200);
    }
    tpu_dataset_free(ds);

    /* a slow map: free waits for the call in progress only */
    ds = make_ds(1000);
    struct counter *c = counter_new(0, 0);
    c->sleep_ms = 50;
    cr_assert_eq(tpu_dataset_batch(ds, 10, 0), TPU_OK);
    cr_assert_eq(tpu_dataset_map(ds, add_fn, c), TPU_OK);
    cr_assert_eq(tpu_dataset_prefetch(ds, TPU_AUTOTUNE), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_new(ds, 0, 0, &it), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
    tpu_dataset_iter_release(it, &b);
    uint64_t t0 = now_ms();
    tpu_dataset_iter_free(it);
    cr_assert_lt(now_ms() - t0, 150);
    cr_assert_lt(atomic_load(&c->calls), 6);
    tpu_dataset_free(ds);
    free(c);
}

Test(dataset, prefetch_thread_errors_surface_on_next, .timeout = 30)
{
    tpu_dataset *ds = make_ds(40);
    struct counter *c = counter_new(0, 0);
    c->fail_at = 3;
    cr_assert_eq(tpu_dataset_batch(ds, 4, 0), TPU_OK);
    cr_assert_eq(tpu_dataset_map(ds, add_fn, c), TPU_OK);
    cr_assert_eq(tpu_dataset_prefetch(ds, 2), TPU_OK);
    tpu_dataset_iter *it;
    tpu_batch b;
    cr_assert_eq(tpu_dataset_iter_new(ds, 1, 0, &it), TPU_OK);
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK, "%s", tpu_last_error());
        cr_assert_eq(b.index, i);
        tpu_dataset_iter_release(it, &b);
    }
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_ABORTED);
    cr_assert(strstr(tpu_last_error(), "on batch 3 of epoch 1"), "%s", tpu_last_error());
    cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_ABORTED);
    tpu_dataset_iter_free(it);
    tpu_dataset_free(ds);
    free(c);
}

/* ---- holding batches ---- */

Test(dataset, at_most_32_held_and_held_buffers_are_not_reused, .timeout = 30)
{
    for (int prefetch = 0; prefetch <= 1; prefetch++) {
        tpu_dataset *ds = make_ds(1000);
        cr_assert_eq(tpu_dataset_shuffle(ds, 1000, 4), TPU_OK);
        cr_assert_eq(tpu_dataset_batch(ds, 3, 0), TPU_OK);
        if (prefetch)
            cr_assert_eq(tpu_dataset_prefetch(ds, 8), TPU_OK);
        tpu_dataset_iter *it;
        tpu_batch held[TPU_MAX_HELD_BATCHES], b;
        size_t first[TPU_MAX_HELD_BATCHES];
        cr_assert_eq(tpu_dataset_iter_new(ds, 0, 0, &it), TPU_OK);
        for (int i = 0; i < TPU_MAX_HELD_BATCHES; i++) {
            cr_assert_eq(tpu_dataset_iter_next(it, &held[i]), TPU_OK);
            first[i] = row_id(&held[i], 0, 0, 0);
        }
        cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_RESOURCE_EXHAUSTED);
        cr_assert(strstr(tpu_last_error(), "release one"), "%s", tpu_last_error());
        if (prefetch)
            sleep_ms(20); /* give the thread every chance to overwrite something */
        for (int i = 0; i < TPU_MAX_HELD_BATCHES; i++) {
            cr_assert_eq(row_id(&held[i], 0, 0, 0), first[i], "held batch %d was overwritten", i);
            for (size_t r = 0; r < held[i].rows; r++)
                row_id(&held[i], r, 0, 0);
        }
        tpu_dataset_iter_release(it, &held[5]);
        cr_assert_null(held[5].x, "release zeroes the batch");
        tpu_dataset_iter_release(it, &held[5]); /* twice through the same struct: ignored */
        cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK, "%s", tpu_last_error());
        cr_assert_eq(b.index, TPU_MAX_HELD_BATCHES);
        for (int i = 0; i < TPU_MAX_HELD_BATCHES; i++)
            if (i != 5)
                cr_assert_eq(row_id(&held[i], 0, 0, 0), first[i]);
        tpu_dataset_iter_release(it, &b);
        for (int i = 0; i < TPU_MAX_HELD_BATCHES; i++)
            tpu_dataset_iter_release(it, &held[i]);
        /* steady state: release as you go, to the end */
        for (int guard = 0; guard < 1000; guard++) {
            cr_assert_eq(tpu_dataset_iter_next(it, &b), TPU_OK);
            if (!b.rows)
                break;
            tpu_dataset_iter_release(it, &b);
        }
        cr_assert_eq(b.rows, 0);
        tpu_dataset_iter_free(it);
        tpu_dataset_free(ds);
    }
}

Test(dataset, a_foreign_batch_aborts, .signal = SIGABRT)
{
    tpu_dataset *a = make_ds(4), *b = make_ds(4);
    tpu_dataset_iter *ia, *ib;
    tpu_batch x;
    cr_assert_eq(tpu_dataset_iter_new(a, 0, 0, &ia), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_new(b, 0, 0, &ib), TPU_OK);
    cr_assert_eq(tpu_dataset_iter_next(ia, &x), TPU_OK);
    tpu_dataset_iter_release(ib, &x);
}
