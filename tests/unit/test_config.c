/* Unit tests of common/base/config: the settings table (flags, environment,
 * defaults, bounds, byte suffixes, bad values). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "config.h"

static const char *listen_v;
static long long hb, bytes;
static int insecure;

static const struct opt table[] = {
    {"listen", "TPUEMU_TEST_LISTEN", OPT_STRING, "127.0.0.1:8470", 0, 0, "ADDR", "listen address", &listen_v},
    {"heartbeat-ms", "TPUEMU_TEST_HB", OPT_INT, "1000", 50, 60000, "MS", "heartbeat", &hb},
    {"hbm-bytes", "TPUEMU_TEST_HBM", OPT_BYTES, "16G", 1, 1LL << 50, "N", "HBM", &bytes},
    {"insecure", "TPUEMU_TEST_INSECURE", OPT_BOOL, NULL, 0, 0, NULL, "allow", &insecure},
};
#define N (sizeof table / sizeof table[0])

static void clear_env(void)
{
    unsetenv("TPUEMU_TEST_LISTEN");
    unsetenv("TPUEMU_TEST_HB");
    unsetenv("TPUEMU_TEST_HBM");
    unsetenv("TPUEMU_TEST_INSECURE");
}

static int parse(int argc, char **argv, int *first, err *e)
{
    return opt_parse(table, N, argc, argv, first, e);
}

TestSuite(config, .init = clear_env);

Test(config, defaults)
{
    char *argv[] = {"prog", NULL};
    int first;
    err e;
    cr_assert_eq(parse(1, argv, &first, &e), CODE_OK);
    cr_assert_str_eq(listen_v, "127.0.0.1:8470");
    cr_assert_eq(hb, 1000);
    cr_assert_eq(bytes, 16LL << 30);
    cr_assert_eq(insecure, 0);
    cr_assert_eq(first, 1);
}

Test(config, flags_both_forms)
{
    char *argv[] = {"prog", "--heartbeat-ms", "100", "--listen=0.0.0.0:1", "--insecure", "--hbm-bytes=512M", NULL};
    int first;
    err e;
    cr_assert_eq(parse(6, argv, &first, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(hb, 100);
    cr_assert_str_eq(listen_v, "0.0.0.0:1");
    cr_assert_eq(insecure, 1);
    cr_assert_eq(bytes, 512LL << 20);
    cr_assert_eq(first, 6);
}

Test(config, env_then_flag_precedence)
{
    char *argv[] = {"prog", NULL};
    char *argv2[] = {"prog", "--heartbeat-ms", "200", NULL};
    int first;
    err e;
    setenv("TPUEMU_TEST_HB", "300", 1);
    setenv("TPUEMU_TEST_INSECURE", "yes", 1);
    cr_assert_eq(parse(1, argv, &first, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(hb, 300, "environment beats the default");
    cr_assert_eq(insecure, 1);
    cr_assert_eq(parse(3, argv2, &first, &e), CODE_OK, "%s", e.msg);
    cr_assert_eq(hb, 200, "flag beats the environment");
}

Test(config, not_an_integer_names_the_flag)
{
    char *argv[] = {"prog", "--heartbeat-ms", "x", NULL};
    int first;
    err e;
    cr_assert_eq(parse(3, argv, &first, &e), CODE_INVALID_ARGUMENT);
    cr_assert_str_eq(e.msg, "--heartbeat-ms: 'x' is not an integer");
}

Test(config, trailing_junk_is_refused)
{
    char *argv[] = {"prog", "--heartbeat-ms", "100ms", NULL};
    int first;
    err e;
    cr_assert_eq(parse(3, argv, &first, &e), CODE_INVALID_ARGUMENT);
}

Test(config, bounds)
{
    char *lo[] = {"prog", "--heartbeat-ms", "49", NULL};
    char *hi[] = {"prog", "--heartbeat-ms", "60001", NULL};
    char *edge[] = {"prog", "--heartbeat-ms", "50", NULL};
    char *huge[] = {"prog", "--heartbeat-ms", "99999999999999999999999", NULL};
    int first;
    err e;
    cr_assert_eq(parse(3, lo, &first, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "out of range") && strstr(e.msg, "50..60000"), "%s", e.msg);
    cr_assert_eq(parse(3, hi, &first, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(parse(3, huge, &first, &e), CODE_INVALID_ARGUMENT);
    cr_assert_eq(parse(3, edge, &first, &e), CODE_OK);
    cr_assert_eq(hb, 50);
}

Test(config, bad_env_names_the_variable)
{
    char *argv[] = {"prog", NULL};
    int first;
    err e;
    setenv("TPUEMU_TEST_HB", "fast", 1);
    cr_assert_eq(parse(1, argv, &first, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "$TPUEMU_TEST_HB"), "%s", e.msg);
}

Test(config, bad_bool_env)
{
    char *argv[] = {"prog", NULL};
    int first;
    err e;
    setenv("TPUEMU_TEST_INSECURE", "maybe", 1);
    cr_assert_eq(parse(1, argv, &first, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "boolean"), "%s", e.msg);
}

Test(config, unknown_flag)
{
    char *argv[] = {"prog", "--nope", NULL};
    int first;
    err e;
    cr_assert_eq(parse(2, argv, &first, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "--nope"), "%s", e.msg);
}

Test(config, missing_value)
{
    char *argv[] = {"prog", "--listen", NULL};
    int first;
    err e;
    cr_assert_eq(parse(2, argv, &first, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "needs a value"), "%s", e.msg);
}

Test(config, help_is_cancelled)
{
    char *argv[] = {"prog", "--help", NULL};
    int first;
    err e;
    cr_assert_eq(parse(2, argv, &first, &e), CODE_CANCELLED);
}

/* --help-man: the same table as a manual page, with roff's special characters
 * escaped (a line starting with '.' would be a request, '\\' an escape). */
Test(config, help_man_writes_the_table_as_a_page)
{
    static const char *path_v;
    static const struct opt t[] = {
        {"heartbeat-ms", "TPUEMU_TEST_HB", OPT_INT, "1000", 50, 60000, "MS", "heartbeat", &hb},
        {"path", NULL, OPT_STRING, NULL, 0, 0, "DIR", ".dot first, then a back\\slash", &path_v},
        {"insecure", "TPUEMU_TEST_INSECURE", OPT_BOOL, NULL, 0, 0, NULL, "allow", &insecure},
    };
    char *argv[] = {"prog", "--help-man", NULL};
    char out[4096], path[] = "/tmp/test_config_man.XXXXXX";
    int first, fd;
    err e;
    FILE *f;
    size_t n;

    clear_env();
    cr_assert_eq(opt_man_mode(), 0);
    cr_assert_eq(opt_parse(t, 3, 2, argv, &first, &e), CODE_CANCELLED);
    cr_assert_eq(opt_man_mode(), 1);
    opt_man_page("tpu-test", 8, "a test program");
    cr_assert((fd = mkstemp(path)) >= 0);
    close(fd);
    cr_assert(freopen(path, "w", stdout));
    opt_usage(t, 3, "tpu-test [OPTIONS]", "Tests the page.");
    opt_man_section("EXIT STATUS", "0: fine.\n\n  an example line");
    fflush(stdout);
    cr_assert((f = fopen(path, "r")));
    n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    fclose(f);
    remove(path);
    cr_assert(strstr(out, ".TH tpu\\-test 8 "), "%s", out);
    cr_assert(strstr(out, ".SH NAME\ntpu\\-test \\- a test program\n"), "%s", out);
    cr_assert(strstr(out, ".SH SYNOPSIS\n.B tpu\\-test [OPTIONS]\n"), "%s", out);
    cr_assert(strstr(out, "\\fB\\-\\-heartbeat\\-ms\\fR \\fIMS\\fR\nheartbeat (default 1000) [$TPUEMU_TEST_HB]\n"),
              "%s", out);
    cr_assert(strstr(out, "\n\\&.dot first, then a back\\eslash\n"), "%s", out);
    cr_assert(strstr(out, "\\fB\\-\\-insecure\\fR\nallow [$TPUEMU_TEST_INSECURE]\n"), "%s", out);
    cr_assert(strstr(out, ".SH ENVIRONMENT\n"), "%s", out);
    cr_assert(strstr(out, ".B TPUEMU_TEST_HB\n\\-\\-heartbeat\\-ms\n"), "%s", out);
    cr_assert(strstr(out, ".SH EXIT STATUS\n0: fine.\n.PP\n.RS 4\n.nf\nan example line\n.fi\n.RE\n"), "%s", out);
}

Test(config, stops_at_positional_and_double_dash)
{
    char *argv[] = {"prog", "--insecure", "cluster", "--heartbeat-ms", "x", NULL};
    char *argv2[] = {"prog", "--", "--heartbeat-ms", NULL};
    int first;
    err e;
    cr_assert_eq(parse(5, argv, &first, &e), CODE_OK);
    cr_assert_eq(first, 2);
    cr_assert_eq(parse(3, argv2, &first, &e), CODE_OK);
    cr_assert_eq(first, 2);
}

Test(config, bad_bytes_value)
{
    char *argv[] = {"prog", "--hbm-bytes", "12Q", NULL};
    int first;
    err e;
    cr_assert_eq(parse(3, argv, &first, &e), CODE_INVALID_ARGUMENT);
    cr_assert(strstr(e.msg, "byte count"), "%s", e.msg);
}

Test(config, byte_suffixes)
{
    long long v;
    cr_assert_eq(opt_parse_bytes("0", &v), 0);
    cr_assert_eq(v, 0);
    cr_assert_eq(opt_parse_bytes("1048576", &v), 0);
    cr_assert_eq(v, 1048576);
    cr_assert_eq(opt_parse_bytes("64M", &v), 0);
    cr_assert_eq(v, 64LL << 20);
    cr_assert_eq(opt_parse_bytes("1k", &v), 0);
    cr_assert_eq(v, 1024);
    cr_assert_eq(opt_parse_bytes("16GiB", &v), 0);
    cr_assert_eq(v, 16LL << 30);
    cr_assert_eq(opt_parse_bytes("2T", &v), 0);
    cr_assert_eq(v, 2LL << 40);
    cr_assert_eq(opt_parse_bytes("3tib", &v), 0);
    cr_assert_eq(v, 3LL << 40);
}

Test(config, bad_bytes)
{
    long long v = 7;
    const char *bad[] = {"", "-1", "+1", "M", "1MB", "1 M", "1.5G", "1X", "99999999999T",
                         "18446744073709551616", "1GiBx", " 1", "\t1M"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(opt_parse_bytes(bad[i], &v), -1, "'%s' should be refused", bad[i]);
    cr_assert_eq(opt_parse_bytes(NULL, &v), -1);
    cr_assert_eq(v, 7, "out untouched on failure");
}

/* A number is digits with at most a '-' in front: no blank, no '+' (strtoll
 * takes both, and " 5" or "+5" from a file or a flag went through). */
Test(config, whole_numbers_are_digits_only)
{
    long long v = 7;
    const char *bad[] = {" 5", "+5", "\t5", "\n5", "5 ", "- 5", "--5", "-", "", "5#0", "0x10"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(opt_parse_int(bad[i], -100, 100, &v), -1, "'%s' should be refused", bad[i]);
    cr_assert_eq(opt_parse_int("-5", -100, 100, &v), 0);
    cr_assert_eq(v, -5);
    cr_assert_eq(opt_parse_int("50", -100, 100, &v), 0);
    cr_assert_eq(v, 50);
}
