/* Unit tests of the worker's tuning knobs (server/worker/core/tuning.h): the
 * rows tpu-worker parses, their defaults, the environment a library reads
 * without the daemon, and the daemon's values winning once set. */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "tuning.h"

static const char *const knobs[] = {"TPUEMU_COLL_CHUNK",   "TPUEMU_COLL_DEPTH", "TPUEMU_COLL_HD_MAX",
                                    "TPUEMU_COLL_SHM_MAX", "TPUEMU_MXU_BF16",   "TPUEMU_SPIN_US"};

static void clear_env(void)
{
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++)
        unsetenv(knobs[i]);
}

Test(tuning, defaults_without_environment, .init = clear_env)
{
    const struct tuning *t = tuning_get();
    cr_assert_eq(t->coll_chunk, 512 * 1024);
    cr_assert_eq(t->coll_depth, 8);
    cr_assert_eq(t->coll_hd_max, -1, "unset: the engine's two bounds");
    cr_assert_eq(t->coll_shm_max, 1024 * 1024);
    cr_assert_eq(t->coll_shm_direct, 1);
    cr_assert_eq(t->spin_us, 200);
    cr_assert_eq(t->heap_prefault_kb, 256);
    cr_assert_eq(t->train_inline_max_us, 1000);
    cr_assert_eq(t->test_step_ms, 0);
    cr_assert_str_eq(t->mxu_bf16, "auto");
}

Test(tuning, a_library_reads_the_environment_at_each_call, .init = clear_env)
{
    setenv("TPUEMU_COLL_CHUNK", "64K", 1);
    setenv("TPUEMU_COLL_HD_MAX", "0", 1);
    setenv("TPUEMU_MXU_BF16", "f32", 1);
    cr_assert_eq(tuning_get()->coll_chunk, 64 * 1024);
    cr_assert_eq(tuning_get()->coll_hd_max, 0);
    cr_assert_str_eq(tuning_get()->mxu_bf16, "f32");
    setenv("TPUEMU_COLL_CHUNK", "1M", 1);
    cr_assert_eq(tuning_get()->coll_chunk, 1024 * 1024);
}

Test(tuning, a_bad_value_leaves_only_its_own_default, .init = clear_env)
{
    setenv("TPUEMU_COLL_DEPTH", "99", 1);     /* out of 1..64 */
    setenv("TPUEMU_COLL_SHM_MAX", "lots", 1); /* not a byte count */
    setenv("TPUEMU_MXU_BF16", "fast", 1);
    setenv("TPUEMU_SPIN_US", "50", 1);
    const struct tuning *t = tuning_get();
    cr_assert_eq(t->coll_depth, 8);
    cr_assert_eq(t->coll_shm_max, 1024 * 1024);
    cr_assert_str_eq(t->mxu_bf16, "auto");
    cr_assert_eq(t->spin_us, 50, "the good value next to them is kept");
}

Test(tuning, the_daemon_checks_its_table_and_its_values_win, .init = clear_env)
{
    struct tuning tu;
    struct opt rows[TUNING_ROWS];
    char prog[] = "tpu-worker", a1[] = "--coll-depth", a2[] = "2", a3[] = "--mxu-bf16", a4[] = "onednn";
    char *argv[] = {prog, a1, a2, a3, a4, NULL};
    int first;
    err e;

    tuning_rows(&tu, rows);
    for (size_t i = 0; i < TUNING_ROWS; i++)
        cr_assert(rows[i].env && strncmp(rows[i].env, "TPUEMU_", 7) == 0 && rows[i].help && *rows[i].help,
                  "row %s has its variable and its help", rows[i].name);
    setenv("TPUEMU_SPIN_US", "7", 1);
    cr_assert_eq(opt_parse(rows, TUNING_ROWS, 5, argv, &first, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(tuning_check(&tu, &e), CODE_OK, "%s", e.msg);
    tu.mxu_bf16 = "wide";
    cr_assert_eq(tuning_check(&tu, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "--mxu-bf16"), "%s", e.msg);
    tu.mxu_bf16 = "onednn";

    tuning_set(&tu);
    setenv("TPUEMU_COLL_DEPTH", "5", 1); /* after tuning_set the environment no longer counts */
    cr_assert_eq(tuning_get()->coll_depth, 2);
    cr_assert_eq(tuning_get()->spin_us, 7);
    cr_assert_str_eq(tuning_get()->mxu_bf16, "onednn");
}
