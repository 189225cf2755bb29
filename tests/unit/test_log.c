/* Unit tests of common/log: the rate limit of lines about what others send
 * (per kind: the first lines written with their reasons, the rest summed up in
 * one "suppressed" line when the window ends). stderr is a temp file here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "log.h"

static char path[64];

static void to_file(void)
{
    snprintf(path, sizeof path, "/tmp/tpuemu-test-log-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    close(fd);
    log_init("test", LOG_INFO);
}

static char *slurp(void)
{
    FILE *f = fopen(path, "r");
    static char buf[1 << 20];
    size_t n;
    cr_assert_not_null(f);
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void fini(void)
{
    unlink(path);
}

TestSuite(log, .init = to_file, .fini = fini);

/* 5000 refusals: 10 lines with their reasons, the rest one line at the end. */
Test(log, flood_is_bounded_and_the_first_refusal_kept)
{
    for (int i = 0; i < 5000; i++)
        log_warn_limited("message refused", "bytes=%d reason=%s", i, log_q("cannot decode the envelope"));
    log_flush_suppressed(1);
    char *out = slurp();
    cr_assert_eq(count(out, "\n"), (int)LOG_LIMIT_BURST + 1, "%s", out);
    cr_assert(strstr(out, "msg=\"message refused\" bytes=0 reason=\"cannot decode the envelope\"\n"),
              "the first refusal, with its reason: %s", out);
    cr_assert(strstr(out, "level=warn daemon=test"), "%s", out);
    cr_assert(strstr(out, "msg=\"message refused: 4990 more like this suppressed in the last "), "%s", out);
    cr_assert(strstr(out, " kind=\"message refused\" suppressed=4990\n"), "%s", out);
    cr_assert_lt(strlen(out), 4000u, "bounded: %zu bytes", strlen(out));
}

/* Each kind has its own budget: a flood of one does not hide another. */
Test(log, kinds_are_limited_apart)
{
    for (int i = 0; i < 100; i++)
        log_warn_limited("message refused", "i=%d", i);
    log_warn_limited("control request refused", "reason=%s", log_q("wrong recipient"));
    log_warn("core dead", "host=h0 core=1");
    char *out = slurp();
    cr_assert_eq(count(out, "msg=\"message refused\""), (int)LOG_LIMIT_BURST, "%s", out);
    cr_assert_eq(count(out, "msg=\"control request refused\" reason=\"wrong recipient\""), 1, "%s", out);
    cr_assert_eq(count(out, "msg=\"core dead\""), 1, "unlimited lines are never held back: %s", out);
}

/* When the window ends the summary comes (at the next line or a flush), and
 * the kind gets its burst again. */
Test(log, window_ends_with_a_summary_and_a_new_burst)
{
    log_limit_set(3, 200);
    for (int i = 0; i < 8; i++)
        log_warn_limited("data-plane connection refused", "i=%d", i);
    log_flush_suppressed(0); /* the window has not ended: nothing yet */
    cr_assert_eq(count(slurp(), "suppressed"), 0, "%s", slurp());
    sleep_ms(250);
    log_flush_suppressed(0);
    char *out = slurp();
    cr_assert_eq(count(out, "msg=\"data-plane connection refused: 5 more like this suppressed in the last "), 1,
                 "%s", out);
    for (int i = 8; i < 12; i++)
        log_warn_limited("data-plane connection refused", "i=%d", i);
    out = slurp();
    cr_assert(strstr(out, " i=8\n") && strstr(out, " i=9\n") && strstr(out, " i=10\n"), "%s", out);
    cr_assert(!strstr(out, " i=11\n"), "%s", out);
    /* the next line of any kind writes a summary that is due */
    sleep_ms(250);
    log_info("something else", NULL);
    out = slurp();
    cr_assert_eq(count(out, "suppressed=1\n"), 1, "%s", out);
    cr_assert_lt(strstr(out, "suppressed=1\n"), strstr(out, "something else"), "the summary first: %s", out);
}

Test(log, below_the_level_nothing_is_counted)
{
    log_init("test", LOG_ERROR);
    for (int i = 0; i < 50; i++)
        log_warn_limited("message refused", "i=%d", i);
    log_flush_suppressed(1);
    cr_assert_str_eq(slurp(), "");
}
