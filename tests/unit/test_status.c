/* Unit tests of common/base/status: code names and the error value. */
#include <string.h>

#include <criterion/criterion.h>

#include "status.h"

Test(status, names_match_the_canonical_codes)
{
    cr_assert_str_eq(code_name(CODE_OK), "OK");
    cr_assert_str_eq(code_name(CODE_INVALID_ARGUMENT), "INVALID_ARGUMENT");
    cr_assert_str_eq(code_name(CODE_FAILED_PRECONDITION), "FAILED_PRECONDITION");
    cr_assert_str_eq(code_name(CODE_UNAVAILABLE), "UNAVAILABLE");
    cr_assert_str_eq(code_name(CODE_UNAUTHENTICATED), "UNAUTHENTICATED");
    cr_assert_eq(CODE_UNAVAILABLE, 14, "gRPC numbering");
    cr_assert_eq(CODE_UNAUTHENTICATED, 16, "gRPC numbering");
}

Test(status, out_of_range_is_unknown)
{
    cr_assert_str_eq(code_name(-1), "UNKNOWN");
    cr_assert_str_eq(code_name(CODE_MAX + 1), "UNKNOWN");
    cr_assert_str_eq(code_name(1000000), "UNKNOWN");
}

Test(status, every_code_has_a_distinct_name)
{
    for (int i = 0; i <= CODE_MAX; i++)
        for (int j = i + 1; j <= CODE_MAX; j++)
            cr_assert_str_neq(code_name(i), code_name(j), "codes %d and %d", i, j);
}

Test(status, err_set_returns_code_and_formats)
{
    err e;
    int rc = err_set(&e, CODE_NOT_FOUND, "core %s/%d", "h0", 3);
    cr_assert_eq(rc, CODE_NOT_FOUND);
    cr_assert_eq(e.code, CODE_NOT_FOUND);
    cr_assert_str_eq(e.msg, "core h0/3");
    cr_assert_eq(err_set(NULL, CODE_ABORTED, "x"), CODE_ABORTED, "NULL err is allowed");
}

Test(status, err_set_truncates_long_messages)
{
    err e;
    char big[4 * ERR_MSG_MAX];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    err_set(&e, CODE_INTERNAL, "%s", big);
    cr_assert_eq(strlen(e.msg), ERR_MSG_MAX - 1);
}

Test(status, err_prefix_adds_context)
{
    err e;
    err_set(&e, CODE_UNAVAILABLE, "connection refused");
    err_prefix(&e, "connecting to %s", "127.0.0.1:8470");
    cr_assert_str_eq(e.msg, "connecting to 127.0.0.1:8470: connection refused");
    cr_assert_eq(e.code, CODE_UNAVAILABLE);
    err_prefix(NULL, "nothing happens");
}

Test(status, err_prefix_stays_bounded)
{
    err e;
    char big[2 * ERR_MSG_MAX];
    memset(big, 'b', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    err_set(&e, CODE_INTERNAL, "%s", big);
    err_prefix(&e, "%s", big);
    cr_assert_lt(strlen(e.msg), (size_t)ERR_MSG_MAX);
}

Test(status, err_clear_resets)
{
    err e;
    err_set(&e, CODE_INTERNAL, "boom");
    err_clear(&e);
    cr_assert_eq(e.code, CODE_OK);
    cr_assert_str_empty(e.msg);
}
