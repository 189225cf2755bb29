/* For the tests that call the client library: fail the test on an error,
 * with the library's message, and drop the library's warnings. */
#ifndef TPUEMU_TESTS_CALLS_H
#define TPUEMU_TESTS_CALLS_H

#include <criterion/criterion.h>

#include <tpuemu/tpuemu.h>

/* expr must return TPU_OK; else the test fails naming expr, the status and
 * tpu_last_error(). */
#define CALL_OK(expr)                                                                                 \
    do {                                                                                              \
        tpu_status st_ = (expr);                                                                      \
        if (st_ != TPU_OK)                                                                            \
            cr_assert_fail("%s: %s: %s", #expr, tpu_status_name(st_), tpu_last_error());             \
    } while (0)

/* A warning handler that drops them (tpu_set_warning_handler). */
static inline void ignore_warning(const char *message, void *user)
{
    (void)message, (void)user;
}

/* Once in a test file: every test starts with warnings dropped. */
#define QUIET_WARNINGS()                                                                              \
    __attribute__((constructor)) static void quiet_warnings(void)                                    \
    {                                                                                                 \
        tpu_set_warning_handler(ignore_warning, NULL);                                                \
    }

#endif
