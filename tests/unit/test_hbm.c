/* Unit tests of HBM accounting: labelled allocations, the out-of-memory
 * message a user reads, peak and reset. */
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "hbm.h"

#define MIB (1024ull * 1024)
#define GIB (1024ull * MIB)

Test(hbm, sizes_come_from_shapes)
{
    hbm h;
    uint32_t id;
    err e;
    const int64_t kernel[] = {784, 128};
    hbm_init(&h, 16 * GIB);
    cr_assert_eq(hbm_alloc(&h, HBM_WEIGHTS, "dense/kernel", "f32", kernel, 2, &id, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(h.used, 784 * 128 * 4);
    cr_assert_eq(hbm_alloc(&h, HBM_ACTIVATIONS, "dense/out", "bf16", kernel, 2, NULL, &e), CODE_OK);
    cr_assert_eq(h.used, 784 * 128 * 6);
    cr_assert_eq(h.by_kind[HBM_WEIGHTS], 784 * 128 * 4);
    cr_assert_eq(h.by_kind[HBM_ACTIVATIONS], 784 * 128 * 2);
    cr_assert_eq(hbm_alloc(&h, HBM_OTHER, "step", "s32", NULL, 0, NULL, &e), CODE_OK, "a scalar");
    cr_assert_eq(h.used, 784 * 128 * 6 + 4);
    hbm_destroy(&h);
}

Test(hbm, over_capacity_reads_like_xla)
{
    hbm h;
    err e;
    const int64_t w[] = {4096, 4096}, act[] = {1024, 4096}, big[] = {1024, 1024, 1024};
    hbm_init(&h, 1 * GIB);
    cr_assert_eq(hbm_alloc(&h, HBM_WEIGHTS, "dense_1/kernel", "f32", w, 2, NULL, &e), CODE_OK);      /* 64M */
    cr_assert_eq(hbm_alloc(&h, HBM_OPTIMIZER, "dense_1/kernel/momentum", "f32", w, 2, NULL, &e), CODE_OK);
    cr_assert_eq(hbm_alloc(&h, HBM_ACTIVATIONS, "dense_1/out", "bf16", act, 2, NULL, &e), CODE_OK); /* 8M */
    uint64_t before = h.used, peak = h.peak;

    cr_assert_eq(hbm_alloc(&h, HBM_ACTIVATIONS, "dense_2/out", "f32", big, 3, NULL, &e),
                 CODE_RESOURCE_EXHAUSTED);
    /* 64M + 64M + 8M + 4G = 4.13G of 1G */
    cr_assert(strstr(e.msg, "Ran out of memory in memory space hbm. Used 4.13G of 1.00G hbm. "
                            "Exceeded hbm capacity by 3.13G."), "%s", e.msg);
    cr_assert(strstr(e.msg, "4.00G for activations 'dense_2/out' f32[1024,1024,1024]"), "%s", e.msg);
    cr_assert(strstr(e.msg, "1. 64.00M weights 'dense_1/kernel' f32[4096,4096]"), "%s", e.msg);
    cr_assert(strstr(e.msg, "2. 64.00M optimizer slots 'dense_1/kernel/momentum' f32[4096,4096]"), "%s", e.msg);
    cr_assert(strstr(e.msg, "3. 8.00M activations 'dense_1/out' bf16[1024,4096]"), "%s", e.msg);
    cr_assert(strstr(e.msg, "smaller per-core batch"), "activations dominate, so batch first: %s", e.msg);
    cr_assert(strstr(e.msg, "recompute"), "%s", e.msg);
    cr_assert_eq(h.used, before, "a failed allocation changes nothing");
    cr_assert_eq(h.peak, peak);
    hbm_destroy(&h);
}

Test(hbm, weight_heavy_models_are_told_to_shrink_the_model)
{
    hbm h;
    err e;
    const int64_t w[] = {16384, 16384};
    hbm_init(&h, 1 * GIB);
    cr_assert_eq(hbm_alloc(&h, HBM_WEIGHTS, "big/kernel", "f32", w, 2, NULL, &e), CODE_OK);
    cr_assert_eq(hbm_alloc(&h, HBM_GRADIENTS, "big/kernel/grad", "f32", w, 2, NULL, &e), CODE_RESOURCE_EXHAUSTED);
    cr_assert(strstr(e.msg, "Used 2.00G of 1.00G hbm. Exceeded hbm capacity by 1.00G."), "%s", e.msg);
    cr_assert(strstr(e.msg, "fewer or narrower layers"), "%s", e.msg);
    hbm_destroy(&h);
}

Test(hbm, exactly_full_fits)
{
    hbm h;
    err e;
    const int64_t d[] = {256, 1024, 1024};
    hbm_init(&h, 1 * GIB);
    cr_assert_eq(hbm_alloc(&h, HBM_INFEED, "infeed/0", "f32", d, 3, NULL, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(hbm_free_bytes(&h), 0);
    const int64_t one[] = {1};
    cr_assert_eq(hbm_alloc(&h, HBM_INFEED, "infeed/1", "u8", one, 1, NULL, &e), CODE_RESOURCE_EXHAUSTED);
    cr_assert(strstr(e.msg, "Exceeded hbm capacity by 1B."), "%s", e.msg);
    hbm_destroy(&h);
}

Test(hbm, peak_release_and_reset)
{
    hbm h;
    uint32_t a, b;
    err e;
    const int64_t d[] = {64, MIB / 4};   /* 64 MiB in f32 */
    hbm_init(&h, GIB);
    cr_assert_eq(hbm_alloc(&h, HBM_ACTIVATIONS, "a", "f32", d, 2, &a, &e), CODE_OK);
    cr_assert_eq(hbm_alloc(&h, HBM_ACTIVATIONS, "b", "f32", d, 2, &b, &e), CODE_OK);
    cr_assert_eq(hbm_release(&h, a, &e), CODE_OK);
    cr_assert_eq(h.used, 64 * MIB);
    cr_assert_eq(h.peak, 128 * MIB, "peak remembers the high-water mark");
    cr_assert_eq(hbm_release(&h, a, &e), CODE_NOT_FOUND, "double release is reported");
    hbm_reset(&h);
    cr_assert_eq(h.used, 0, "initialize empties HBM");
    cr_assert_eq(h.peak, 0);
    cr_assert_eq(hbm_release(&h, b, &e), CODE_NOT_FOUND, "blocks from before the reset are gone");
    struct hbm_block top[4];
    cr_assert_eq(hbm_largest(&h, top, 4), 0);
    hbm_destroy(&h);
}

Test(hbm, largest_first)
{
    hbm h;
    err e;
    struct hbm_block top[3];
    hbm_init(&h, GIB);
    for (int64_t i = 1; i <= 10; i++) {
        int64_t d[] = {i * 100};
        char name[16];
        snprintf(name, sizeof name, "t%d", (int)i);
        cr_assert_eq(hbm_alloc(&h, HBM_OTHER, name, "f32", d, 1, NULL, &e), CODE_OK);
    }
    cr_assert_eq(hbm_largest(&h, top, 3), 3);
    cr_assert_str_eq(top[0].name, "t10");
    cr_assert_str_eq(top[1].name, "t9");
    cr_assert_str_eq(top[2].name, "t8");
    hbm_destroy(&h);
}

Test(hbm, bad_requests_are_refused)
{
    hbm h;
    err e;
    const int64_t neg[] = {-1, 4}, huge[] = {INT64_MAX, INT64_MAX};
    hbm_init(&h, GIB);
    cr_assert_eq(hbm_alloc(&h, HBM_WEIGHTS, "w", "f31", neg, 0, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(hbm_alloc(&h, HBM_WEIGHTS, "w", "f32", neg, 2, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(hbm_alloc(&h, HBM_WEIGHTS, "w", "f32", huge, 2, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(hbm_alloc(&h, HBM_WEIGHTS, "w", "f32", neg, 9, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(hbm_alloc(&h, HBM_KINDS, "w", "f32", NULL, 0, NULL, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(h.used, 0);
    hbm_destroy(&h);
}

Test(hbm, sizes_print_like_xla)
{
    char b[32];
    hbm_format_size(0, b, sizeof b);
    cr_assert_str_eq(b, "0B");
    hbm_format_size(1536, b, sizeof b);
    cr_assert_str_eq(b, "1.50K");
    hbm_format_size(530 * MIB, b, sizeof b);
    cr_assert_str_eq(b, "530.00M");
    hbm_format_size(16 * GIB, b, sizeof b);
    cr_assert_str_eq(b, "16.00G");
}

/* XLA's TPU compile-time out-of-memory report, as TensorFlow users read it in
 * a ResourceExhaustedError from a Keras fit on Cloud TPU (XLA's TPU compiler;
 * openxla/xla docs/errors/error_1000.md, "Compile Time: HBM OOM", gives the
 * first line; TensorFlow users' reports quote the usage block):
 *   "XLA:TPU compile permanent error. Ran out of memory in memory space hbm.
 *    Used 19.46G of 15.48G hbm. Exceeded hbm capacity by 3.98G.
 *    Total hbm usage >= 19.98G:
 *        reserved        530.00M
 *        program          19.46G
 *        arguments            0B"
 * "Used" counts the program and its arguments, "of" the capacity left after
 * what is reserved (16G - 530M = 15.48G). A program that does not fit is
 * refused whole: nothing of it stays allocated. */
Test(hbm, program_over_capacity_reads_like_xla_tpu_compile)
{
    hbm h;
    err e;
    uint32_t held, ids[4];
    const int64_t r[] = {256 * MIB};
    struct hbm_req req[4] = {
        {HBM_WEIGHTS, "dense/kernel", "f32", 2, {4096, 4096}},          /* 64M argument */
        {HBM_OPTIMIZER, "Adam/dense/kernel/m", "f32", 2, {4096, 4096}}, /* 64M argument */
        {HBM_GRADIENTS, "gradients/dense/kernel", "f32", 2, {4096, 4096}}, /* 64M program */
        {HBM_ACTIVATIONS, "dense/activations", "f32", 2, {65536, 4096}},   /* 1G program */
    };
    hbm_init(&h, GIB);
    cr_assert_eq(hbm_alloc(&h, HBM_OTHER, "held", "u8", r, 1, &held, &e), CODE_OK); /* 256M reserved */
    cr_assert_eq(hbm_alloc_program(&h, req, 4, ids, &e), CODE_RESOURCE_EXHAUSTED);
    const char *head = "XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
                       "Used 1.19G of 768.00M hbm. Exceeded hbm capacity by 448.00M.\n\n"
                       "Total hbm usage >= 1.44G:\n"; /* 64M x 3 + 1G of 1G - 256M; + 256M */
    cr_assert(strncmp(e.msg, head, strlen(head)) == 0, "%s", e.msg);
    cr_assert(strstr(e.msg, "\n    reserved     256.00M\n"), "%s", e.msg);
    cr_assert(strstr(e.msg, "\n    program        1.06G\n"), "%s", e.msg);
    cr_assert(strstr(e.msg, "\n    arguments    128.00M\n"), "%s", e.msg);
    cr_assert(strstr(e.msg, "Largest allocations in hbm:\n  1. 1.00G activations 'dense/activations' "
                            "f32[65536,4096]\n  2. 256.00M other 'held' u8[268435456]\n"), "%s", e.msg);
    cr_assert(strstr(e.msg, "smaller per-core batch"), "activations dominate: %s", e.msg);
    cr_assert_eq(h.used, 256 * MIB, "a refused program leaves nothing allocated");
    cr_assert_eq(h.nblocks, 1);

    /* without the activations it fits: every block allocated, each its id */
    cr_assert_eq(hbm_alloc_program(&h, req, 3, ids, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(h.used, 256 * MIB + 192 * MIB);
    cr_assert_eq(h.by_kind[HBM_OPTIMIZER], 64 * MIB);
    cr_assert_eq(hbm_release(&h, ids[1], &e), CODE_OK);
    cr_assert_eq(h.by_kind[HBM_OPTIMIZER], 0);
    /* a bad shape is refused before anything is allocated */
    req[0].dims[0] = -1;
    cr_assert_eq(hbm_alloc_program(&h, req, 1, ids, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "dense/kernel"), "%s", e.msg);
    hbm_destroy(&h);
}
